"""The cores and memory a host gives Laneway (core/util/host.py), read from a planted
/proc and cgroup tree in the test's own folder, and the count of cpu workers `laneway
fleet` starts from them (fleet/processes.py, cpu_worker_count)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from core.config.host import available_memory, usable_cores
from core.config.settings import Settings
from fleet.processes import (
    AUTO_CPU_WORKERS_MAX,
    FLEET_RESERVE_BYTES,
    WORKER_BASE_BYTES,
    cpu_worker_count,
    weights_bytes,
)
from workers.cores import host_batch_workers

GIB = 1 << 30
AFFINITY = len(os.sched_getaffinity(0))


def plant(root: Path, **files: str) -> Path:
    """`files` under root, by path with `__` for `/` (proc__meminfo)."""
    for name, text in files.items():
        path = root / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    "quota,cores",
    [
        (None, AFFINITY),  # no cgroup file: the affinity
        ("max 100000", AFFINITY),  # no quota
        ("50000 100000", 1),  # half a core still runs one worker
        ("150000 100000", min(2, AFFINITY)),  # 1.5 cores: two threads can use them
        ("garbage", AFFINITY),
        ("100000 0", AFFINITY),
    ],
)
def test_usable_cores_are_the_affinity_within_the_cgroups_quota(tmp_path, quota, cores):
    root = plant(tmp_path, **({"sys__fs__cgroup__cpu.max": quota} if quota else {}))
    assert usable_cores(root) == cores


def test_available_memory_is_memavailable_within_the_cgroups_limit(tmp_path):
    meminfo = "MemTotal:  32000000 kB\nMemAvailable:  20000000 kB\n"
    alone = plant(tmp_path / "a", proc__meminfo=meminfo)
    assert available_memory(alone) == 20000000 * 1024
    # A pod limited to 4 GiB that holds 1 GiB already has 3 GiB left, not the node's 19.
    pod = plant(
        tmp_path / "b",
        proc__meminfo=meminfo,
        **{
            "sys__fs__cgroup__memory.max": str(4 * GIB),
            "sys__fs__cgroup__memory.current": str(GIB),
        },
    )
    assert available_memory(pod) == 3 * GIB
    unlimited = plant(
        tmp_path / "c",
        proc__meminfo=meminfo,
        **{"sys__fs__cgroup__memory.max": "max", "sys__fs__cgroup__memory.current": "5"},
    )
    assert available_memory(unlimited) == 20000000 * 1024
    assert available_memory(plant(tmp_path / "d", proc__meminfo="MemAvailable: lots\n")) is None
    assert available_memory(tmp_path / "nothing") is None


def test_the_machine_itself_is_read():
    assert 1 <= usable_cores() <= (os.cpu_count() or 1)
    assert (available_memory() or 0) > 0


ROOMY = 64 * GIB


def test_auto_starts_a_worker_per_core_of_one_thread_each():
    auto = Settings.from_env({})
    assert cpu_worker_count(auto, cores=2, memory=ROOMY) == 2
    assert cpu_worker_count(auto, cores=1, memory=ROOMY) == 1
    # A large host: fewer workers of more threads, each a Postgres pool and a model's copy.
    assert cpu_worker_count(auto, cores=64, memory=ROOMY) == AUTO_CPU_WORKERS_MAX
    # The operator's thread count divides the cores.
    four = Settings.from_env({"LANEWAY_TORCH_THREADS": "4"})
    assert cpu_worker_count(four, cores=16, memory=ROOMY) == 4
    assert cpu_worker_count(four, cores=2, memory=ROOMY) == 1  # never none


def test_auto_starts_no_more_workers_than_memory_holds():
    auto = Settings.from_env({})
    each = WORKER_BASE_BYTES + 2 * weights_bytes(auto)
    room = FLEET_RESERVE_BYTES + each  # the rest of the fleet: web and co, the interactive worker
    assert cpu_worker_count(auto, cores=8, memory=room + 3 * each) == 3
    assert cpu_worker_count(auto, cores=8, memory=room + 3 * each - 1) == 2
    assert cpu_worker_count(auto, cores=8, memory=GIB // 4) == 1  # a small host still runs one
    assert cpu_worker_count(auto, cores=8, memory=None) == 8  # unknown memory: the cores decide


def test_a_large_models_weights_make_fewer_workers(tmp_path):
    """A registry model of 3 GiB of weights on a 16 GiB, 8-core host: a worker per core
    would hold 8 copies (the failure of a laptop that TorchServe's per-core default met)."""
    model = tmp_path / "big"
    model.mkdir()
    with open(model / "model.safetensors", "wb") as f:
        f.truncate(3 * GIB)  # sparse: no disk taken
    (model / "README.md").write_text("not weights")
    registry = json.dumps({"big": {"kind": "embedding", "path": str(model)}})
    big = Settings.from_env({"LANEWAY_MODELS": registry, "LANEWAY_EMBED_MODEL": "big"})
    assert weights_bytes(big) >= 3 * GIB  # MiniLM's for the other tasks beside it
    assert cpu_worker_count(big, cores=8, memory=16 * GIB) == 1
    assert cpu_worker_count(Settings.from_env({}), cores=8, memory=16 * GIB) == 8


def test_a_count_the_operator_gives_stands():
    for count in (0, 1, 3, 20):
        chosen = Settings.from_env({"LANEWAY_CPU_WORKERS": str(count)})
        assert cpu_worker_count(chosen, cores=2, memory=GIB) == count


def test_the_default_fleet_runs_the_counted_workers_sharing_the_cores():
    from fleet.processes import worker_fleet

    settings = Settings.from_env({})
    count = cpu_worker_count(settings)
    fleet = worker_fleet(settings)
    names = sorted(n for n in fleet.children if n.startswith("worker-cpu"))
    assert len(names) == count
    share = str(max(1, settings.torch_threads // count)) if count > 1 else None
    assert {fleet.children[n].env.get("LANEWAY_TORCH_THREADS") for n in names} == {share}


def test_each_of_n_batch_workers_on_a_host_counts_n_for_its_step_aside():
    assert host_batch_workers(1, cores=2) == 2
    assert host_batch_workers(2, cores=2) == 1
    assert host_batch_workers(4, cores=16) == 4
    assert host_batch_workers(8, cores=2) == 1
