"""DELETE /v1/jobs/<id> against a real worker: the chunk that finished keeps its results,
the running chunk stops at its next micro-batch, the chunks not started are skipped."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from db.models import Chunk, JobItem, Result
from db.session import session_scope
from jobs.submit import submit_job
from tests.e2e.procs import http, start_web, wait_for
from tests.faults.harness import LONG_TEXT, cpu_worker

pytestmark = pytest.mark.e2e


def test_cancel_stops_the_running_chunk_between_micro_batches(
    lanes, migrated, account_factory, shared_web, tmp_path
):
    """On either broker of the batch lanes (the web app with it: RabbitMQ needs its own).
    `shared_web` is an argument on both, not looked up in the test: a package's fixture
    started inside a test would be stopped by `quiet` as the test's own process, and the
    next test to share it would find it gone."""
    settings = lanes
    account, key = account_factory("trial")
    # Chunks of 60 long texts, one text per micro-batch: a chunk runs for seconds.
    items = [(f"c{i}", f"{LONG_TEXT} #{i}") for i in range(180)]
    job_id = submit_job(account, items, settings=settings.replace(chunk_size=60)).id
    if settings.broker_is_rabbitmq:
        own_web = web, url = start_web(tmp_path)
    else:
        own_web, (web, url) = None, shared_web
    worker = cpu_worker(tmp_path, "cpu-cancel", env={"LANEWAY_BATCH_SIZE": "1"})
    try:

        def chunks():
            with session_scope(settings) as session:
                return list(
                    session.scalars(select(Chunk).where(Chunk.job_id == job_id).order_by(Chunk.seq))
                )

        def one_done_one_running():
            # The worker takes the chunks in the order the broker hands them out, which
            # need not be their sequence.
            states = sorted(c.state for c in chunks())
            return states == ["done", "queued", "running"]

        wait_for(one_done_one_running, 180, "a chunk done and another running", [worker])
        running = next(c.id for c in chunks() if c.state == "running")
        asked = time.monotonic()
        response = http.delete(
            f"{url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"}
        )
        assert response.status_code == 202
        assert response.json()["status"] in ("cancelling", "cancelled")

        def ended():
            body = http.get(
                f"{url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"}
            ).json()
            return body if body["status"] == "cancelled" else None

        body = wait_for(ended, 60, "the job to end cancelled", [worker, web])
        stopped_after = time.monotonic() - asked
    finally:
        worker.stop()
        if own_web:
            web.stop()
    done = [c for c in chunks() if c.state == "done"]
    stopped = [c for c in chunks() if c.id == running]
    never = [c for c in chunks() if c.state == "cancelled" and c.id != running]
    assert len(done) == len(stopped) == len(never) == 1
    assert stopped[0].state == "cancelled" and stopped[0].attempts == 1
    assert never[0].attempts == 0  # never started
    first = done[0]
    # The finished chunk's 60 results stay; the stopped chunk wrote none.
    assert body["counts"] == {"succeeded": 60, "failed": 0, "cancelled": 120}
    with session_scope(settings) as session:
        kept = session.execute(
            select(JobItem.pos, Result.error)
            .join(JobItem, (JobItem.job_id == Result.job_id) & (JobItem.idx == Result.idx))
            .where(Result.job_id == job_id)
        ).all()
    assert sorted(pos for pos, _ in kept) == list(range(first.start, first.stop))
    assert all(error is None for _, error in kept)
    broker = "rabbitmq" if settings.broker_is_rabbitmq else "redis"
    print(f"FIGURES cancel ({broker}): stopped_after={stopped_after:.2f}s")
