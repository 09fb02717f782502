"""Postgres goes away in the middle of a job, three times (what a server restart does to
its clients: every connection cut, new ones refused for a while): tasks retry their
database work with backoff, and the job completes with each item's result exactly once.

The outage is made for the test database alone (its connections terminated, new ones
refused by ALLOW_CONNECTIONS false for a few seconds): restarting the server would cut
every other database on this shared machine too."""

from __future__ import annotations

import time

import psycopg
import pytest

from tests.conftest import PG_ADMIN
from tests.e2e.procs import wait_for
from tests.faults.harness import (
    RECOVERY_DEADLINE,
    assert_exactly_one_result_each,
    beat,
    chunk_states,
    cpu_worker,
    events,
    submit,
    wait_final,
)

pytestmark = pytest.mark.e2e


OUTAGE_SECONDS = 5


def outage(database: str) -> int:
    """Refuse new connections to `database`, cut the open ones, and after OUTAGE_SECONDS
    accept connections again. Returns how many connections were cut."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        try:
            cut = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            ).fetchall()
            time.sleep(OUTAGE_SECONDS)  # the length of the outage, not a wait for a result
        finally:
            conn.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
    return len(cut)


def running_tasks(settings, name: str) -> list[int]:
    """The running chunk tasks of the live workers named `name`, as their rows count them."""
    from sqlalchemy import select

    from db.models import Worker
    from db.session import session_scope

    with session_scope(settings) as session:
        return list(
            session.scalars(
                select(Worker.running_tasks).where(
                    Worker.hostname.like(f"{name}@%"), Worker.stopped_at.is_(None)
                )
            )
        )


def test_postgres_connections_cut_mid_job_lose_nothing(
    settings, migrated, account_factory, tmp_path
):
    from sqlalchemy.engine import make_url

    database = make_url(settings.database_url).database
    account, _ = account_factory("trial")
    n = 96
    job_id = submit(settings, account, n)
    procs = [beat(tmp_path), cpu_worker(tmp_path, "cpu-pg")]
    cuts = 0
    try:
        for _ in range(3):  # three cuts, each once more of the job is done
            done_before = chunk_states(settings, job_id).count("done")

            def progressed(before=done_before):
                states = chunk_states(settings, job_id)
                return states.count("done") > before or "queued" not in states

            wait_for(progressed, 120, "another chunk to finish", procs)
            cuts += outage(database)
        cut_at = time.monotonic()
        status = wait_final(settings, job_id, RECOVERY_DEADLINE, procs)
        took = time.monotonic() - cut_at
        # Every chunk task's start and end was counted, those the outages refused too:
        # the worker is idle again (beat stops an idle gpu worker by this count).
        wait_for(lambda: running_tasks(settings, "cpu") == [0], 60,
                 "the worker counted idle again", procs)  # fmt: skip
    finally:
        for proc in reversed(procs):
            proc.stop()
    assert cuts >= 3  # the worker's, its heartbeat's, this test's connections
    assert status == "succeeded", status
    # The outages hit work in flight: tasks failed on the database and were retried.
    assert "OperationalError" in procs[1].log.read_text()
    assert_exactly_one_result_each(settings, job_id, n)
    assert len(events(settings, job_id, "finalized")) == 1
    print(f"FIGURES postgres: items={n} connections_cut={cuts} finished_in={took:.1f}s")
