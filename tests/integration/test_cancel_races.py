"""A cancel racing workers that start the job's chunks, on the real Postgres.

A worker starting a chunk locks the chunk's row, then the job's; a cancel locks the job's
row, then only the chunks nobody holds (`SKIP LOCKED`, jobs/chunks.py rule 3). Were the
cancel to wait for a chunk being started, the two would wait for each other: Postgres then
fails one of them (`deadlock detected`, a 503 to the cancel).
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from db.models import Chunk, Job
from db.session import session_factory, session_scope
from jobs.chunks import JOB_LOCK_AT_START
from jobs.lifecycle import cancel_job
from tasks.chunks import _claim
from tests.factories import stored_job
from tests.locks import ends_or_waits


def _job(settings, chunks: int) -> tuple:
    return stored_job(settings, [f"text {n}" for n in range(chunks)], chunk_size=1)


def _states(settings, job_id) -> tuple[str, list[str]]:
    with session_scope(settings) as session:
        job = session.get(Job, job_id)
        chunks = session.query(Chunk).filter_by(job_id=job_id).order_by(Chunk.seq).all()
        return job.status, [c.state for c in chunks]


def test_a_cancel_while_a_worker_holds_a_chunk_neither_waits_nor_deadlocks(
    settings, migrated, worker_app
):
    """The worker holds chunk 0 (its claim's first lock) when the cancel comes; only then
    does it ask for the job's row. The cancel must end without waiting for chunk 0, and
    the worker must then see the cancel and cancel chunk 0 itself."""
    worker_app(settings)
    job_id, (first, *rest) = _job(settings, 3)
    starting = session_factory(settings)()
    pool = ThreadPoolExecutor(1)
    try:
        assert starting.get(Chunk, first, with_for_update=True).state == "queued"
        cancel = pool.submit(cancel_job, job_id, settings)
        # The cancel either ends or waits for chunk 0's lock (the deadlock's first half).
        assert ends_or_waits(settings, cancel, 20), "the cancel waits for a chunk being started"
        assert cancel.result() == "cancelling"
        # The worker's second lock, as `_claim` takes it: the job's row, then its status.
        job = starting.get(Job, job_id, with_for_update=JOB_LOCK_AT_START)
        assert job.status == "cancelling"
        starting.commit()
    finally:
        starting.close()  # a waiting cancel gets chunk 0 and ends
        pool.shutdown()
    assert _states(settings, job_id) == ("cancelling", ["queued", "cancelled", "cancelled"])
    # The real claim of chunk 0's message cancels it and the job ends cancelled.
    assert _claim("test-host", first, "run") is None
    assert _states(settings, job_id) == ("cancelled", ["cancelled"] * 3)


@pytest.mark.parametrize("round_", range(3))
def test_cancels_racing_real_claims_all_end_without_errors(settings, migrated, worker_app, round_):
    """Twenty jobs of four chunks: one thread claims every chunk (the worker's real claim)
    while another cancels every job, started together. No call fails (the deadlock made
    one of each pair fail), and each chunk ends claimed-and-running or cancelled: none
    stays queued, and a claim that ran after its job's cancel cancelled its chunk."""
    worker_app(settings)
    jobs = [_job(settings, 4) for _ in range(20)]
    start = threading.Barrier(2)
    errors: list[BaseException] = []
    claimed: dict[int, bool] = {}

    def claims() -> None:
        start.wait()
        for _, chunk_ids in jobs:
            for chunk_id in chunk_ids:
                try:
                    claimed[chunk_id] = _claim("test-host", chunk_id, "run") is not None
                except BaseException as exc:  # noqa: BLE001 - every failure is the finding
                    errors.append(exc)

    def cancels() -> None:
        start.wait()
        for job_id, _ in jobs:
            try:
                cancel_job(job_id, settings)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

    threads = [threading.Thread(target=claims), threading.Thread(target=cancels)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    for job_id, chunk_ids in jobs:
        status, states = _states(settings, job_id)
        assert status in ("cancelling", "cancelled")
        for chunk_id, state in zip(chunk_ids, states, strict=True):
            assert state == ("running" if claimed[chunk_id] else "cancelled"), (chunk_id, state)
        assert (status == "cancelled") == ("running" not in states)
