"""A job stored on SQLite (the embedded default) while other processes write: its intake
holds the database's write lock from its first staged item, so a worker's heartbeat landing
mid-intake waits for the job instead of failing it with "database is locked"."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db.intake import collect_items, create_job, stage_items
from db.models import Job, JobItem
from jobs.planner import plan_chunks
from tests.factories import sqlite_with_account


@pytest.mark.parametrize("collect", [stage_items, collect_items], ids=["staged", "collected"])
def test_a_write_landing_mid_intake_waits_for_the_job_instead_of_failing_it(tmp_path, collect):
    path = tmp_path / "laneway.db"
    with sqlite_with_account(path) as (engine, account_id):
        # Another process (a worker's heartbeat), told to wait a moment at most.
        other = sqlite3.connect(path, timeout=0.2)
        texts = [f"message {i}" for i in range(50)]
        with Session(engine) as session:
            staged = collect(session, ((f"i{i}", t, i) for i, t in enumerate(texts)))
            # The routing's reads come between the staging and the job's rows.
            session.execute(select(func.count()).select_from(Job)).scalar()
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("UPDATE accounts SET share_weight = 2 WHERE id = ?", (account_id,))
            other.rollback()
            job = create_job(
                session,
                account_id=account_id,
                tasks=["classify"],
                labels=["a", "b"],
                items=staged,
                lane="cpu",
                chunks=plan_chunks(len(texts), 16),
                chunk_size=16,
                held=True,
            )
            session.commit()
            job_id = job.id
        other.execute("UPDATE accounts SET share_weight = 2 WHERE id = ?", (account_id,))
        other.commit()  # the heartbeat goes on once the job is stored
        other.close()
        with Session(engine) as session:
            items = session.scalar(
                select(func.count()).select_from(JobItem).where(JobItem.job_id == job_id)
            )
            assert items == len(texts)
