"""The naive baseline's task (bench/naive.py) is the benchmark's: its worker includes it, and
a production worker's app never registers it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAIVE = "laneway.naive_item"


def test_a_production_worker_does_not_load_the_naive_task():
    # In a fresh interpreter: importing bench.naive here would register it on every app.
    probe = (
        "from tasks.app import TASK_MODULES, app\n"
        "app.loader.import_default_modules()\n"
        "print(sorted(TASK_MODULES)); print('laneway.run_chunk' in app.tasks, "
        f"{NAIVE!r} in app.tasks)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr
    modules, registered = done.stdout.splitlines()[-2:]
    assert "naive" not in modules
    assert registered == "True False"  # the real tasks are there; the naive one is not


def test_the_benchmarks_worker_includes_the_naive_task(monkeypatch, tmp_path):
    from core.config.settings import Settings

    # The benchmark sets these for its run (a temporary LANEWAY_HOME when none is set):
    # here they name this test's folder, and are undone after it.
    monkeypatch.setenv("HF_HUB_OFFLINE", "kept")
    monkeypatch.setenv("LANEWAY_HOME", str(tmp_path))
    spec = importlib.util.spec_from_file_location("bench_throughput", ROOT / "bench/throughput.py")
    throughput = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(throughput)
    argv = throughput.bench_worker_argv(Settings.from_env({}), "bench-x")
    assert argv[argv.index("--include") + 1] == "bench.naive"
    assert "-Q" in argv and argv[argv.index("-Q") + 1] == "cpu,maintenance"
    # The module it names imports from the worker's directory (the checkout) and registers
    # the task there.
    probe = "import bench.naive as n; print(n.naive_item.name)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [NAIVE]
