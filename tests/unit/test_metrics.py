"""Metrics shaping: model stages, the queues' gauges, and folding dead processes' files."""

from __future__ import annotations

import os

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from core.obs import metrics


def test_a_model_stage_that_forwarded_nothing_records_nothing():
    def count(sample: str) -> float:
        return REGISTRY.get_sample_value(sample, {"lane": "unit"}) or 0.0

    metrics.record_model("unit", 0.0, [])
    assert count("laneway_model_stage_seconds_count") == 0
    assert count("laneway_batch_size_count") == 0
    metrics.record_model("unit", 0.02, [32, 5])
    assert count("laneway_model_stage_seconds_count") == 1
    assert count("laneway_batch_size_count") == 2 and count("laneway_batch_size_sum") == 37


def test_queue_gauges_carry_each_queue_and_count():
    families = metrics.queue_families(
        {
            "cpu": {"queued": 3, "delivered": 2, "depth": 5},
            "gpu": {"queued": 0, "delivered": 1, "depth": 1},
        }
    )
    samples = {(f.name, s.labels["queue"]): s.value for f in families for s in f.samples}
    assert samples[("laneway_queue_depth", "cpu")] == 5
    assert samples[("laneway_queue_queued", "cpu")] == 3
    assert samples[("laneway_queue_delivered", "gpu")] == 1


def _write(path, name, key, value):
    d = MmapedDict(str(path / name))
    d.write_value(key, value, 0.0)
    d.close()


def _scrape(path) -> str:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(path))
    return generate_latest(registry).decode()


def test_dead_processes_files_fold_into_an_archive_and_keep_their_counts(tmp_path):
    key = mmap_key(
        "laneway_items_processed_total", "laneway_items_processed_total", ["lane"], ["cpu"], "Items"
    )
    _write(tmp_path, "counter_web-1-101.db", key, 5.0)
    _write(tmp_path, "counter_web-1-102.db", key, 7.0)
    _write(tmp_path, "counter_web-1-103.db", key, 1.0)  # alive: left alone
    _write(tmp_path, "counter_worker-2-101.db", key, 4.0)  # another container's: left alone
    gauge = mmap_key("g", "g", [], [], "a gauge")
    _write(tmp_path, "gauge_liveall_web-1-101.db", gauge, 1.0)
    before = _scrape(tmp_path)
    assert 'laneway_items_processed_total{lane="cpu"} 17.0' in before

    def compact():
        return metrics.compact(tmp_path, alive=lambda pid: pid == 103, host="web-1")

    removed = compact()
    assert sorted(p.name for p in removed) == [
        "counter_web-1-101.db",
        "counter_web-1-102.db",
        "gauge_liveall_web-1-101.db",
    ]
    assert sorted(p.name for p in tmp_path.glob("*.db")) == [
        "counter_archive.db",
        "counter_web-1-103.db",
        "counter_worker-2-101.db",
    ]
    assert 'laneway_items_processed_total{lane="cpu"} 17.0' in _scrape(tmp_path)
    # A second death adds to the archive; nothing is counted twice.
    _write(tmp_path, "counter_web-1-104.db", key, 2.0)
    compact()
    assert 'laneway_items_processed_total{lane="cpu"} 19.0' in _scrape(tmp_path)
    assert compact() == []


def test_a_file_left_empty_by_a_killed_process_is_removed_and_never_breaks_a_scrape(tmp_path):
    """MmapedDict creates its file empty, then sizes it: a process killed in between leaves a
    file prometheus_client cannot read. A live process's file can be read in that moment too."""
    key = mmap_key("c_total", "c_total", [], [], "a counter")
    _write(tmp_path, "counter_web-1-101.db", key, 3.0)
    (tmp_path / "counter_web-1-102.db").touch()  # dead, never sized
    (tmp_path / "histogram_web-1-103.db").touch()  # alive, being sized

    def scrape() -> str:
        registry = CollectorRegistry()
        metrics.FolderCollector(registry, path=str(tmp_path))
        return generate_latest(registry).decode()

    assert "c_total 3.0" in scrape()
    removed = metrics.compact(tmp_path, alive=lambda pid: pid == 103, host="web-1")
    assert sorted(p.name for p in removed) == ["counter_web-1-101.db", "counter_web-1-102.db"]
    assert sorted(p.name for p in tmp_path.glob("*.db")) == [
        "counter_archive.db",
        "histogram_web-1-103.db",
    ]
    assert "c_total 3.0" in scrape()


def test_flower_is_bounded_and_persists_nothing_in_the_working_directory(tmp_path):
    from core.config.settings import Settings
    from fleet.processes import flower_argv

    argv = flower_argv(Settings(home=tmp_path), "0.0.0.0", 5555, 10000)
    assert "--max_tasks=10000" in argv and "--persistent=False" in argv
    assert f"--db={tmp_path / 'flower.db'}" in argv and "--address=0.0.0.0" in argv


def test_every_worker_process_of_a_pod_serves_the_folder_on_one_port(tmp_path):
    """`laneway worker gpu` runs a worker per device in one pod: each binds the pod's
    metrics port, each answers with the whole folder (a dead process's counts included,
    folded into the archive at the scrape), and one stopping leaves the other serving."""
    import httpx

    from core.obs.metrics_server import serve_folder
    from tests.e2e.procs import free_port

    key = mmap_key("c_total", "c_total", [], [], "a counter")
    _write(tmp_path, f"counter_{metrics.HOST}-{2**22 + 7}.db", key, 3.0)  # no such pid
    port = free_port()
    first = serve_folder(tmp_path, "127.0.0.1", port)
    second = serve_folder(tmp_path, "127.0.0.1", port)
    try:
        for _ in range(4):  # connections spread over both sockets
            assert "c_total 3.0" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert [p.name for p in tmp_path.glob("*.db")] == ["counter_archive.db"]
        first.shutdown()
        first.server_close()
        for _ in range(4):
            assert "c_total 3.0" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        second.shutdown()
        second.server_close()


@pytest.mark.slow  # it forks
def test_a_forked_child_counts_in_a_file_of_its_own_pid():
    """The process identifier is kept, not asked for at each count: a forked child must
    still count in its own file, never in its parent's (a shared mapping)."""
    assert metrics.DIR is not None
    metrics.record_items("forked", 2, 0)  # the parent's file, opened before the fork
    pid = os.fork()
    if pid == 0:  # the child: count, and leave without pytest's exit handlers
        try:
            metrics.record_items("forked", 3, 0)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)

    def counted(owner: int) -> float:
        path = metrics.DIR / f"counter_{metrics.HOST}-{owner}.db"
        if not path.exists():
            return 0.0
        found = MmapedDict.read_all_values_from_file(str(path))
        return sum(v for key, v, *_ in found if '"forked"' in key and "_total" in key)

    assert counted(pid) == 3
    assert counted(os.getpid()) == 2  # the child's 3 not added to the parent's file
