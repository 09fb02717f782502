"""SIGKILL of a whole worker in the middle of a chunk: the job still completes, each item
with exactly one result (real workers, beat, Postgres and Redis)."""

from __future__ import annotations

import os
import signal

import pytest
from sqlalchemy import select

from db.models import Chunk, Job, Result
from db.session import session_scope
from laneway.jobs import submit_job
from tests.e2e.procs import BIN, Proc, start_worker, wait_for

pytestmark = pytest.mark.e2e

# Short limits so the test finishes in a couple of minutes: the broker's visibility timeout
# (and the reconciler's deadline) becomes 2 * 5 + 60 = 70 s.
FAST = {"LANEWAY_CHUNK_TIMEOUT": "5", "LANEWAY_RECONCILE_INTERVAL": "2"}
LONG_TEXT = " ".join(["the parcel arrived late and the box was crushed again"] * 25)


def test_sigkill_mid_chunk_loses_nothing(settings, migrated, account_factory, tmp_path):
    account, _ = account_factory("trial")
    items = [(f"k{i}", f"{LONG_TEXT} #{i}") for i in range(48)]  # 3 chunks of 16
    job = submit_job(account, items, settings=settings)

    victim = start_worker("cpu", [str(BIN / "laneway"), "worker", "cpu"], tmp_path, env=FAST)

    def claimed():
        with session_scope(settings) as session:
            return session.scalar(
                select(Chunk.id).where(Chunk.job_id == job.id, Chunk.state == "running")
            )

    killed_chunk = wait_for(claimed, 60, "a chunk to start", [victim])
    os.killpg(victim.proc.pid, signal.SIGKILL)  # parent and child: no warm shutdown
    victim.proc.wait()

    beat = Proc("beat", [str(BIN / "laneway"), "beat"], tmp_path, env=FAST)
    survivor = start_worker("cpu", [str(BIN / "laneway"), "worker", "cpu"], tmp_path, env=FAST)
    try:

        def finished():
            with session_scope(settings) as session:
                status = session.get(Job, job.id).status
                return status if status not in ("queued", "running") else None

        assert wait_for(finished, 240, "the job to finish", [survivor, beat]) == "succeeded"
    finally:
        survivor.stop()
        beat.stop()
    with session_scope(settings) as session:
        rows = session.execute(
            select(Result.idx, Result.error).where(Result.job_id == job.id)
        ).all()
        assert sorted(r.idx for r in rows) == list(range(48))
        assert all(r.error is None for r in rows)
        assert session.get(Chunk, killed_chunk).attempts >= 2
