"""`laneway flower` on the test broker: it answers its health check, sees a worker come up,
keeps no more tasks than --max-tasks while a real worker runs more, and writes nothing into
the working directory."""

from __future__ import annotations

import re
import signal
import socket
from pathlib import Path

import httpx
import pytest

from tests.e2e.procs import BIN, Proc, free_port, http, start_worker, wait_for

pytestmark = pytest.mark.e2e
MAX_TASKS = 3


def test_flower_runs_on_the_broker_and_sees_a_worker(tmp_path, monkeypatch):
    port = free_port()
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)  # what Flower would write into the working directory shows here
    flower = Proc(
        "flower",
        [str(BIN / "laneway"), "flower", "--port", str(port), "--max-tasks", str(MAX_TASKS)],
        tmp_path,
        # Its HTTP API (/api/tasks) answers without a login only when told to.
        env={"FLOWER_UNAUTHENTICATED_API": "true"},
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

        # More tasks than it may keep, through the real worker: it sees every one (its
        # event counter) and keeps only the newest MAX_TASKS (its task list).
        from tasks.app import app

        sent = [app.send_task("laneway.scale_down") for _ in range(2 * MAX_TASKS)]
        for result in sent:
            result.get(timeout=30)
        ids = [result.id for result in sent]
        # Counted whatever the task label: a task Flower already dropped (it keeps only
        # MAX_TASKS) is counted under task="" when its last event arrives.
        succeeded = re.compile(
            r'^flower_events_total\{task="[^"]*",type="task-succeeded",'
            rf'worker="{re.escape(node)}"\}} (\S+)$',
            re.M,
        )

        def all_seen() -> bool:
            text = http.get(f"{url}/metrics", timeout=5).text
            return sum(float(n) for n in succeeded.findall(text)) >= len(ids)

        def events() -> str:
            text = http.get(f"{url}/metrics", timeout=5).text
            return "\n".join(line for line in text.splitlines() if "flower_events_total" in line)

        wait_for(all_seen, 30, "Flower to see every task succeed", [flower, worker], events)
        kept = http.get(f"{url}/api/tasks", timeout=5).json()
        assert len(kept) == MAX_TASKS and set(kept) <= set(ids) and ids[-1] in kept, kept
        worker.stop()
        # The Flower process `laneway flower` started is the one told to keep that few.
        pid = flower.proc.pid
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
        argv = [open(f"/proc/{c}/cmdline").read().split("\0") for c in children]
        assert any("flower" in a and f"--max_tasks={MAX_TASKS}" in a for a in argv), argv
        # SIGTERM to `laneway flower` alone (what docker stop does) stops Flower too.
        flower.proc.send_signal(signal.SIGTERM)
        assert flower.proc.wait(30) == 0, flower.tail()
        assert not any(Path(f"/proc/{c}").exists() for c in children), children
    finally:
        flower.stop()
    assert list(workdir.iterdir()) == []
