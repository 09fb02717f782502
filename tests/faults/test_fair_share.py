"""Fair share with real workers, beat, Postgres and Redis: a small job of one account is not
held behind another account's big one, and under sharing a worker killed mid-chunk, a
cancellation and Redis emptied mid-job lose nothing (each item one result)."""

from __future__ import annotations

import os
import signal

import pytest
import redis
from sqlalchemy import func, select

from db.models import Chunk, Result
from db.session import session_scope
from jobs.lifecycle import cancel_job
from tests.e2e.procs import wait_for
from tests.faults.harness import (
    RECOVERY_DEADLINE,
    assert_exactly_one_result_each,
    beat,
    chunk_states,
    cpu_worker,
    submit,
    wait_final,
)

pytestmark = pytest.mark.e2e
SHORT = "my parcel arrived late and the box was crushed"


def results(settings, job_id) -> int:
    with session_scope(settings) as session:
        return session.scalar(select(func.count()).where(Result.job_id == job_id)) or 0


def test_a_small_job_passes_a_big_one_and_a_kill_and_a_cancel_lose_nothing(
    settings, migrated, account_factory, tmp_path
):
    big_account, _ = account_factory("enterprise")
    small_account, _ = account_factory("trial")
    third, _ = account_factory("trial")
    # Chunks of 16, all on the cpu lane (an enterprise job this size would go to the gpu's).
    shared = settings.replace(chunk_size=16, gpu_threshold=10**6)
    big = submit(shared, big_account, 640, "b", SHORT)  # 40 chunks
    worker = cpu_worker(tmp_path, "cpu-share")
    procs = [worker]
    try:
        wait_for(lambda: chunk_states(settings, big).count("done") >= 2, 120,
                 "the big job under way", procs)  # fmt: skip
        small = submit(shared, small_account, 32, "s", SHORT)
        assert wait_final(settings, small, 60, procs) == "succeeded"
        # The big job still had work waiting when the small one ended: it was not held behind.
        assert "held" in chunk_states(settings, big)
        assert_exactly_one_result_each(settings, small, 32)

        # A third account's job joins; the worker dies in the middle of a chunk.
        other = submit(shared, third, 96, "o", SHORT)

        def running() -> int | None:
            with session_scope(settings) as session:
                return session.scalar(
                    select(Chunk.id).where(Chunk.job_id.in_([big, other]), Chunk.state == "running")
                )

        wait_for(running, 60, "a chunk running", procs)
        os.killpg(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait()
        cancel_job(big, settings)  # while its chunks wait, run or are lost with the worker
        procs = [beat(tmp_path, "beat-share"), cpu_worker(tmp_path, "cpu-share-survivor")]
        assert wait_final(settings, other, RECOVERY_DEADLINE, procs) == "succeeded"
        assert wait_final(settings, big, RECOVERY_DEADLINE, procs) == "cancelled"
    finally:
        for proc in procs:
            proc.stop()
    assert_exactly_one_result_each(settings, other, 96)
    with session_scope(settings) as session:
        done = session.scalar(
            select(func.coalesce(func.sum(Chunk.stop - Chunk.start), 0)).where(
                Chunk.job_id == big, Chunk.state == "done"
            )
        )
        duplicates = session.scalar(
            select(func.count()).select_from(
                select(Result.idx)
                .where(Result.job_id == big)
                .group_by(Result.idx)
                .having(func.count() > 1)
                .subquery()
            )
        )
    assert results(settings, big) == done and duplicates == 0  # what finished, once
    assert set(chunk_states(settings, big)) <= {"done", "cancelled"}


def test_redis_emptied_under_sharing_loses_nothing(settings, migrated, account_factory, tmp_path):
    first_account, _ = account_factory("trial")
    second_account, _ = account_factory("trial")
    shared = settings.replace(chunk_size=16)
    first = submit(shared, first_account, 160, "f", SHORT)  # 10 chunks
    second = submit(shared, second_account, 160, "g", SHORT)
    procs = [beat(tmp_path, "beat-flush-share"), cpu_worker(tmp_path, "cpu-flush-share")]
    try:

        def both_under_way() -> bool:
            states = [chunk_states(settings, j) for j in (first, second)]
            return all(s.count("done") >= 1 and "held" in s for s in states)

        wait_for(both_under_way, 120, "both jobs under way", procs)
        redis.Redis.from_url(settings.redis_url).flushdb()
        for job in (first, second):
            assert wait_final(settings, job, RECOVERY_DEADLINE, procs) == "succeeded"
    finally:
        for proc in procs:
            proc.stop()
    for job in (first, second):
        assert_exactly_one_result_each(settings, job, 160)
