"""The whole fleet: the web app and real `celery worker` processes on Postgres and Redis."""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
import subprocess
import sys
import uuid

import pytest
import redis
from sqlalchemy import func, select

from db.models import Chunk, Result
from db.session import session_scope
from tests.e2e.procs import BIN, http, start_worker, wait_for
from workers.devices import cuda_available

pytestmark = pytest.mark.e2e

FINAL = ("succeeded", "partial", "failed", "cancelled")
TEXTS = [
    "I was charged twice for my subscription this month",
    "The parcel is three days late and tracking has not updated",
    "I cannot log in, the password reset email never arrives",
    "The app crashes whenever I open the settings page",
    "Please cancel my order and refund the money",
    "Great service, the support team solved everything quickly",
]


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e-logs")


@pytest.fixture(scope="module")
def web(shared_web):
    return shared_web[1]


@pytest.fixture(scope="module")
def cpu_worker(migrated, logdir):
    # The plain Celery command line works as well as `laneway worker cpu`.
    argv = [
        str(BIN / "celery"),
        "-A",
        "tasks",
        "worker",
        "-Q",
        "cpu,maintenance",
        "-n",
        "cpu@%h",
        "-c",
        "1",
    ]
    proc = start_worker("cpu", argv + ["--loglevel", "INFO"], logdir)
    yield proc
    proc.stop()


def items(n: int, prefix: str) -> list[dict[str, str]]:
    return [{"id": f"{prefix}-{i}", "text": f"{TEXTS[i % len(TEXTS)]} (#{i})"} for i in range(n)]


def submit(url: str, key: str, n: int, prefix: str) -> dict:
    response = http.post(
        f"{url}/v1/jobs",
        json={"task": "classify", "items": items(n, prefix)},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 202, response.text
    return response.json()


def get_job(url: str, key: str, job_id: str) -> dict:
    response = http.get(f"{url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    return response.json()


def wait_final(url: str, key: str, job_id: str, procs, timeout: float = 180) -> dict:
    def final():
        job = get_job(url, key, job_id)
        return job if job["status"] in FINAL else None

    return wait_for(final, timeout, f"job {job_id} to finish", procs)


def assert_exactly_one_result_each(settings, job_id: str, n: int, prefix: str) -> None:
    key = uuid.UUID(job_id)
    with session_scope(settings) as session:
        rows = session.execute(
            select(Result.idx, Result.item_id, Result.error).where(Result.job_id == key)
        ).all()
    assert len(rows) == n
    assert sorted(r.idx for r in rows) == list(range(n))
    assert {r.item_id for r in rows} == {f"{prefix}-{i}" for i in range(n)}
    assert all(r.error is None for r in rows)


def chunk_workers(settings, job_id: str) -> list[tuple[str, str | None]]:
    with session_scope(settings) as session:
        return [
            (c.state, c.worker)
            for c in session.scalars(select(Chunk).where(Chunk.job_id == uuid.UUID(job_id)))
        ]


@pytest.mark.skipif(cuda_available(), reason="this machine has CUDA: the gpu worker may start")
def test_gpu_worker_refuses_to_start_without_cuda_or_fallback(migrated):
    for argv in (
        [str(BIN / "laneway"), "worker", "gpu"],
        [str(BIN / "celery"), "-A", "tasks", "worker", "-Q", "gpu", "-n", "refuse@%h"],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode != 0
        assert "LANEWAY_GPU_FALLBACK=cpu" in done.stdout + done.stderr


def test_jobs_run_on_the_queue_their_lane_names(settings, web, cpu_worker, account_factory, logdir):
    _, enterprise_key = account_factory("enterprise")
    _, trial_key = account_factory("trial")

    # Above LANEWAY_GPU_THRESHOLD (40) for an enterprise account: the gpu lane.
    gpu_job = submit(web, enterprise_key, 50, "g")
    assert gpu_job["lane"] == "gpu"
    # A trial account stays on cpu whatever its size.
    cpu_job = submit(web, trial_key, 45, "c")
    assert cpu_job["lane"] == "cpu"

    done = wait_final(web, trial_key, cpu_job["id"], [cpu_worker])
    assert done["status"] == "succeeded"
    assert done["progress"] == {"done": 45, "total": 45, "percent": 100.0}
    assert done["counts"] == {"succeeded": 45, "failed": 0, "cancelled": 0}
    assert sum(done["label_counts"].values()) == 45
    assert done["stage_seconds"]["model"] > 0
    cost = done["cost"]
    assert cost["total"] > 0 and cost["currency"] == "USD"
    assert cost["by_stage"]["model"] > cost["by_stage"]["pre"] > 0
    assert abs(cost["per_item"] * 45 - cost["total"]) < 1e-6
    assert_exactly_one_result_each(settings, cpu_job["id"], 45, "c")
    assert all(w.startswith("cpu@") for _, w in chunk_workers(settings, cpu_job["id"]))

    # The cpu worker finished a job sent after the gpu job, yet ran only the gpu chunks'
    # pre-processing (sent first): their model stages wait for a gpu worker.
    waiting = get_job(web, enterprise_key, gpu_job["id"])
    assert waiting["status"] == "running" and waiting["progress"]["done"] == 0
    assert chunk_workers(settings, gpu_job["id"]) == [("queued", None)] * 4
    with session_scope(settings) as session:
        stages = session.scalars(
            select(Chunk.stage).where(Chunk.job_id == uuid.UUID(gpu_job["id"]))
        ).all()
    assert stages == ["model"] * 4
    # Its model stages wait in the gpu queue (other tests' gpu jobs may wait there too).
    waiting_ids = {
        json.loads(m)["headers"]["id"]
        for m in redis.Redis.from_url(settings.redis_url).lrange("gpu", 0, -1)
    }
    with session_scope(settings) as session:
        task_ids = set(
            session.scalars(select(Chunk.task_id).where(Chunk.job_id == uuid.UUID(gpu_job["id"])))
        )
    assert len(task_ids) == 4 and task_ids <= waiting_ids

    gpu_worker = start_worker(
        "gpu0",  # `laneway worker gpu` names each worker after its device
        [str(BIN / "laneway"), "worker", "gpu"],
        logdir,
        env={"LANEWAY_GPU_FALLBACK": "cpu"},
    )
    try:
        done = wait_final(web, enterprise_key, gpu_job["id"], [gpu_worker, cpu_worker])
    finally:
        gpu_worker.stop()
    assert done["status"] == "succeeded" and done["lane"] == "gpu"
    assert done["counts"] == {"succeeded": 50, "failed": 0, "cancelled": 0}
    assert_exactly_one_result_each(settings, gpu_job["id"], 50, "g")
    # Only the model stage ran on the gpu worker; pre- and post-processing ran on cpu.
    assert all(w.startswith("gpu0@") for _, w in chunk_workers(settings, gpu_job["id"]))
    assert done["stage_seconds"]["pre"] > 0 and done["stage_seconds"]["post"] > 0

    headers = {"Authorization": f"Bearer {enterprise_key}"}
    lines = http.get(f"{web}/v1/jobs/{gpu_job['id']}/results", headers=headers).text.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["id"] for r in records] == [f"g-{i}" for i in range(50)]
    assert all(
        r["label"] in done["labels"] and r["score"] == r["scores"][r["label"]] for r in records
    )
    csv_text = http.get(f"{web}/v1/jobs/{gpu_job['id']}/results?format=csv", headers=headers).text
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    assert len(rows) == 50 and rows[0]["id"] == "g-0" and rows[0]["label"] == records[0]["label"]


def test_cli_creates_an_account_and_submits_a_file_with_progress(
    settings, web, cpu_worker, tmp_path
):
    created = subprocess.run(
        [
            str(BIN / "laneway"),
            "accounts",
            "create",
            f"cli-{uuid.uuid4().hex[:6]}",
            "--type",
            "demo",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    key = created.stdout.strip().splitlines()[-1]
    assert key.startswith("lw_") and "shown once" in created.stderr

    path = tmp_path / "upload.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "text"])
        for item in items(20, "f"):
            writer.writerow([item["id"], item["text"]])
    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "submit", str(path), "--wait", "--url", web],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "LANEWAY_API_KEY": key},
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "queued on the cpu lane" in done.stdout
    assert "succeeded on the cpu lane; 20 succeeded, 0 failed" in done.stdout
    assert "job " in done.stderr  # the progress bar's label
    job_id = done.stdout.split()[1]
    assert_exactly_one_result_each(settings, job_id, 20, "f")

    # A gzipped file goes up the same way, with an upload progress bar.
    gz = tmp_path / "upload.csv.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    queued = subprocess.run(
        [str(BIN / "laneway"), "submit", str(gz), "--url", web],
        capture_output=True,
        text=True,
        env={**os.environ, "LANEWAY_API_KEY": key},
        timeout=60,
    )
    assert queued.returncode == 0, queued.stderr
    assert "queued on the cpu lane" in queued.stdout and "uploading upload.csv.gz" in queued.stderr
    with session_scope(settings) as session:
        assert session.scalar(select(func.count()).where(Result.job_id == uuid.UUID(job_id))) == 20


def test_a_fast_lane_s_chunks_grow_from_what_its_worker_measured(
    settings, cpu_worker, account_factory
):
    """LANEWAY_CHUNK_SECONDS on: a job's chunks are sized from the stage seconds the real
    worker wrote for the lane's earlier chunks of the same tasks, and a job cut into the
    larger chunks still gets exactly one result per item."""
    from db.models import Job
    from jobs.submit import submit_job

    account, _ = account_factory("trial")  # the cpu lane, whatever the size
    sizing = settings.replace(chunk_seconds=1.0, max_chunk_size=400)
    tasks = ["extract", "embed"]  # a task list no other test runs: its measurements are ours

    def run(n: int, prefix: str) -> Job:
        texts = [(f"{prefix}-{i}", f"{TEXTS[i % len(TEXTS)]} (#{i})") for i in range(n)]
        job = submit_job(account, texts, tasks=tasks, settings=sizing)

        def final() -> bool:
            with session_scope(settings) as session:
                return session.get(Job, job.id).status in FINAL

        wait_for(final, 300, f"job {job.id} to finish", [cpu_worker])
        assert_exactly_one_result_each(settings, str(job.id), n, prefix)
        return job

    first = run(640, "m")  # nothing measured on these tasks: LANEWAY_CHUNK_SIZE (16)
    assert first.chunk_size == settings.chunk_size == 16
    assert first.routing["chunking"]["worker_items_per_second"] is None
    second = run(1600, "n")
    chunking = second.routing["chunking"]
    speed, workers = chunking["worker_items_per_second"], chunking["workers"]
    assert speed > 16  # the worker ran 16 items in well under a second
    expected = max(16, min(math.ceil(speed), 400, math.ceil(1600 / (2 * max(1, workers)))))
    assert second.chunk_size == chunking["size"] == expected > 16
