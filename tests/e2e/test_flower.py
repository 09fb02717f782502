"""`laneway flower` on the test broker: it answers its health check, sees a worker come up,
keeps its task count bounded, and writes nothing into the working directory."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import httpx
import pytest

from tests.e2e.procs import BIN, Proc, free_port, http, start_worker, wait_for

pytestmark = pytest.mark.e2e


def test_flower_runs_on_the_broker_and_sees_a_worker(tmp_path, monkeypatch):
    port = free_port()
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)  # what Flower would write into the working directory shows here
    flower = Proc(
        "flower",
        [str(BIN / "laneway"), "flower", "--port", str(port), "--max-tasks", "50"],
        tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            try:
                return http.get(f"{url}/healthcheck", timeout=2).text == "OK"
            except httpx.TransportError:
                return False

        wait_for(healthy, 60, "Flower's /healthcheck", [flower])
        # A worker that loads no model comes up in a second or two.
        name = "flowerseen"
        worker = start_worker(
            name,
            [str(BIN / "laneway"), "worker", "maintenance", "--name", name],
            tmp_path,
            models=False,
        )
        node = f"{name}@{socket.gethostname()}"
        sample = f'flower_worker_online{{worker="{node}"}} 1.0'

        def seen() -> bool:
            return sample in http.get(f"{url}/metrics", timeout=5).text

        wait_for(seen, 60, f"Flower to see {node} online", [flower, worker])
        worker.stop()
        # The Flower process `laneway flower` started keeps at most 50 tasks.
        pid = flower.proc.pid
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
        argv = [open(f"/proc/{c}/cmdline").read().split("\0") for c in children]
        assert any("flower" in a and "--max_tasks=50" in a for a in argv), argv
        # SIGTERM to `laneway flower` alone (what docker stop does) stops Flower too.
        flower.proc.send_signal(signal.SIGTERM)
        assert flower.proc.wait(30) == 0, flower.tail()
        assert not any(Path(f"/proc/{c}").exists() for c in children), children
    finally:
        flower.stop()
    assert list(workdir.iterdir()) == []
