"""Interactive requests stay fast while a batch job runs on the same machine: the web app
under gunicorn, a batch cpu worker busy with a job's chunks, and the interactive worker."""

from __future__ import annotations

import json
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest
from sqlalchemy import select

from db.models import Chunk, Job
from db.session import session_scope
from inference.precision import choose
from jobs.submit import submit_job
from tests.e2e.procs import BIN, http, start_worker, wait_for
from tests.faults.harness import cpu_worker

pytestmark = pytest.mark.e2e


def test_interactive_answers_while_a_batch_job_runs(
    settings, account_factory, shared_web, tmp_path
):
    account, key = account_factory("trial")
    headers = {"Authorization": f"Bearer {key}"}
    items = [(f"b{i}", f"batch text number {i} about a late parcel") for i in range(900)]
    job_id = submit_job(account, items, settings=settings).id
    web, url = shared_web
    argv = [str(BIN / "laneway"), "worker", "interactive", "--name", "interactive-e2e"]
    # As on a shared 2-core machine: the batch worker yields (niceness, a thread fewer,
    # and it steps aside while the interactive worker is busy).
    shared = {
        "LANEWAY_TORCH_THREADS": "2",
        "LANEWAY_BATCH_NICE": "10",
        "LANEWAY_BATCH_YIELD_MAX": "10",
    }
    interactive = start_worker("interactive-e2e", argv, tmp_path, env=shared)
    batch = cpu_worker(tmp_path, "cpu-load", env=shared)
    procs = [web, interactive, batch]

    def chunk_states():
        with session_scope(settings) as session:
            return list(session.scalars(select(Chunk.state).where(Chunk.job_id == job_id)))

    wait_for(lambda: "done" in chunk_states(), 120, "the batch job under way", procs)
    seconds: list[float] = []

    def ask() -> None:
        text = f"I was charged twice on my credit card, fix the payment ({len(seconds)})"
        body = {"items": [{"id": "1", "text": text}], "labels": ["billing", "shipping"]}
        started = time.perf_counter()
        r = http.post(f"{url}/v1/classify", json=body, headers=headers)
        seconds.append(time.perf_counter() - started)
        assert r.status_code == 200, r.text
        assert r.json()["results"][0]["label"] == "billing"

    for _ in range(20):
        ask()
    # The batch job was still running all along: the answers did not wait for it.
    assert {"queued", "running"} & set(chunk_states())
    # The batch worker and its pool run at niceness 10, loaded with every core (both
    # threads); the interactive worker at the normal priority with both too.
    tree = [psutil.Process(batch.proc.pid), *psutil.Process(batch.proc.pid).children(True)]
    assert {p.nice() for p in tree if "celery" in " ".join(p.cmdline())} == {10}
    assert psutil.Process(interactive.proc.pid).nice() == 0
    assert "with 2 torch threads" in batch.log.read_text()
    assert "with 2 torch threads" in interactive.log.read_text()
    # A lone request's text runs on ONNX Runtime on both cores (inference/lone.py); the
    # batch worker has no lone requests and builds no session.
    runs = "torch (bf16" if choose("auto", "cpu").precision == "bf16" else "onnxruntime fp32 on 2"
    assert f"one text alone: {runs}" in interactive.log.read_text()
    assert "one text alone" not in batch.log.read_text()
    # Its model threads tokenize their own batches, a core each (workers/signals.py).
    assert re.search(
        r"each \(\d+ for a batch alone\), TOKENIZERS_PARALLELISM=false", interactive.log.read_text()
    )

    # The interactive worker's requests mark the host busy, and the batch worker, in
    # another process, waits for them between micro-batches (its chunk logs the wait
    # when it ends, once the mark has lapsed). A chunk looks before each micro-batch, and
    # a test chunk is one: requests go on until one began while the mark stood.
    def stepped_aside() -> bool:
        if "stepped aside" in batch.log.read_text():
            return True
        ask()
        return False

    wait_for(stepped_aside, 60, "a chunk to step aside", procs)
    # Generous bounds for a shared 2-core machine (docs/benchmarks.md has the figures);
    # a request queued behind the job's chunks would take seconds.
    assert statistics.median(seconds) < 0.5 and max(seconds) < 2.0, seconds

    # A request not answered in time (here: at once, `Prefer: wait=0`) becomes a job, and
    # its results come later from the batch lane, once the big job is out of the way.
    late = {"items": [{"id": "late", "text": "my parcel never arrived"}]}
    r = http.post(f"{url}/v1/embed", json=late, headers={**headers, "Prefer": "wait=0"})
    assert r.status_code == 202, r.text
    assert http.delete(f"{url}/v1/jobs/{job_id}", headers=headers).status_code == 202

    def finished():
        body = http.get(f"{url}{r.json()['links']['self']}", headers=headers).json()
        return body if body["status"] in ("succeeded", "partial", "failed") else None

    assert wait_for(finished, 120, "the stored request's job", procs)["status"] == "succeeded"
    lines = http.get(f"{url}{r.json()['links']['results']}", headers=headers).text.splitlines()
    (result,) = [json.loads(line) for line in lines]
    assert result["id"] == "late" and len(result["embedding"]) == 384

    # Bursts of such requests at once, more than each web process's Postgres pool holds
    # (5 + 5 connections, 32 threads): each becomes its job, none waits out the pool (a
    # job once took a second connection while holding its first, and such a burst
    # deadlocked the pool into 30 s waits and 503s).
    _, big_key = account_factory("enterprise")  # 5000 requests a minute: none refused
    big = {"Authorization": f"Bearer {big_key}", "Prefer": "wait=0"}

    def fallback(n: int) -> httpx.Response:
        body = {"items": [{"id": "b", "text": f"burst request {n}"}]}
        with httpx.Client(timeout=60) as client:
            return client.post(f"{url}/v1/embed", json=body, headers=big)

    with ThreadPoolExecutor(64) as pool:  # 64 clients, three requests each
        answers = list(pool.map(fallback, range(192)))
    assert [a.status_code for a in answers] == [202] * 192, [a.text for a in answers][:3]
    burst_jobs = {a.json()["id"] for a in answers}
    assert len(burst_jobs) == 192

    def burst_done() -> bool:  # every one of them runs: nothing lost, nothing left behind
        with session_scope(settings) as session:
            ended = session.scalars(
                select(Job.status).where(Job.id.in_(burst_jobs), Job.status == "succeeded")
            ).all()
        return len(ended) == len(burst_jobs)

    wait_for(burst_done, 300, "the burst's jobs", procs)
