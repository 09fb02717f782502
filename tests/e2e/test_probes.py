"""The liveness probes compose and Kubernetes run (`laneway probe ...`), against real
processes: each fails while its process is absent or stuck and passes while it runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.procs import BIN, Proc, start_worker, wait_for

pytestmark = pytest.mark.e2e


def probe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "laneway"), "probe", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def test_the_beat_probe_follows_beats_ticks(tmp_path):
    env = {"LANEWAY_HOME": str(tmp_path / "home"), "LANEWAY_RECONCILE_INTERVAL": "1"}
    heartbeat = tmp_path / "home" / "beat-heartbeat"

    absent = probe("beat", env=env)
    assert absent.returncode == 1 and "beat has not ticked" in absent.stderr

    beat = Proc("beat", [str(BIN / "laneway"), "beat"], tmp_path, env)
    try:
        wait_for(lambda: probe("beat", env=env).returncode == 0, 60, "the beat probe", [beat])
        # Beat sends tasks by name and runs none: having loaded the task modules, it has
        # not loaded torch (inference/stages.py).
        tree = psutil.Process(beat.proc.pid).children(recursive=True)
        assert any("beat" in p.cmdline() for p in tree)
        assert not any("libtorch" in Path(f"/proc/{p.pid}/maps").read_text() for p in tree)
        # Not only a file left at start-up: beat's ticks keep it fresh. Made old, it is
        # touched again within a tick (the reconciler is due every second here).
        old = time.time() - 600
        os.utime(heartbeat, (old, old))
        wait_for(lambda: probe("beat", env=env).returncode == 0, 30, "a fresh tick", [beat])
    finally:
        assert beat.stop() == 0, beat.tail()

    # Stopped, nothing touches it: once older than the limit, the probe fails.
    old = time.time() - 120
    os.utime(heartbeat, (old, old))
    stale = probe("beat", env=env)
    # The probe reads the age a moment later (it starts a Python process): 120 s or more.
    ticked = re.search(r"beat last ticked (\d+) s ago", stale.stderr)
    assert stale.returncode == 1 and ticked and 120 <= int(ticked[1]) < 180, stale.stderr


def test_the_worker_probe_pings_the_node_without_loading_torch(tmp_path):
    assert probe("worker", "maintenance", "--timeout", "1").returncode == 1

    worker = start_worker(
        "maintenance",
        [str(BIN / "laneway"), "worker", "maintenance"],
        tmp_path,
        models=False,
    )
    try:
        # Run the way compose and Kubernetes run it, noting what the probe imported.
        shown = subprocess.run(
            [sys.executable, "-c",
             "import atexit, sys\n"
             "atexit.register(lambda: print('heavy:', sorted({'torch', 'tasks', 'transformers'}"
             " & set(sys.modules))))\n"
             "sys.argv = ['laneway', 'probe', 'worker', 'maintenance']\n"
             "from fleet.cli import main\n"
             "main()\n"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert "answered" in shown.stdout and "heavy: []" in shown.stdout
        # Another node's name is no answer from this one.
        assert probe("worker", "nobody", "--timeout", "1").returncode == 1
    finally:
        worker.stop()
    assert probe("worker", "maintenance", "--timeout", "1").returncode == 1
