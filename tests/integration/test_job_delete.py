"""A deleted job takes its items and results with it, on Postgres and on SQLite, though
neither table has a foreign key to jobs (db/migrations/versions/0014): a trigger deletes
them, also when the job goes with its account, and also when its delete meets a chunk
that is finishing at that moment."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from sqlalchemy import create_engine, delete, func, inspect, select, text

from db.models import Account, Chunk, Job, JobItem, Result
from db.results import upsert_results
from db.session import session_scope
from tests.factories import stored_job


def _rows(session, job_id) -> tuple[int, int]:
    items = session.scalar(select(func.count()).where(JobItem.job_id == job_id))
    results = session.scalar(select(func.count()).where(Result.job_id == job_id))
    return items, results


def _with_results(settings, texts) -> uuid.UUID:
    job_id, _ = stored_job(settings, texts, chunk_size=2)
    with session_scope(settings) as session:
        rows = [{"idx": i, "item_id": f"i{i}", "output": {"label": "a"}} for i in range(len(texts))]
        upsert_results(session, job_id, rows)
        assert _rows(session, job_id) == (len(texts), len(texts))
    return job_id


def test_deleting_a_job_deletes_its_items_and_results_and_no_other_jobs(settings, migrated):
    gone, kept = _with_results(settings, ["a", "b", "c"]), _with_results(settings, ["d", "e"])
    with session_scope(settings) as session:
        session.execute(delete(Job).where(Job.id == gone))
    with session_scope(settings) as session:
        assert _rows(session, gone) == (0, 0)
        assert _rows(session, kept) == (2, 2)


def test_deleting_an_account_deletes_its_jobs_rows(settings, migrated):
    job_id = _with_results(settings, ["a", "b"])
    with session_scope(settings) as session:
        account = session.scalar(select(Job.account_id).where(Job.id == job_id))
        session.execute(delete(Account).where(Account.id == account))
    with session_scope(settings) as session:
        assert session.get(Job, job_id) is None
        assert _rows(session, job_id) == (0, 0)


def test_a_job_deleted_while_a_chunk_finishes_leaves_none_of_its_results(settings, migrated):
    """The chunk's finish holds its chunk row locked while it writes the results (as
    jobs/chunks.finish does); the job's delete waits on that lock in its cascade to the
    chunks, and the trigger after it deletes the results the finish committed."""
    if not settings.database_url.startswith("postgresql"):
        pytest.skip("concurrent transactions: Postgres")
    job_id, chunk_ids = stored_job(settings, ["a", "b"], chunk_size=2)
    engine = create_engine(settings.database_url)
    deleted: list[BaseException | None] = []
    backend: list[int] = []

    def delete_job() -> None:
        try:
            with engine.begin() as conn:
                backend.append(conn.connection.driver_connection.info.backend_pid)
                conn.execute(delete(Job).where(Job.id == job_id))
            deleted.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            deleted.append(exc)

    try:
        with session_scope(settings) as finishing:
            chunk = finishing.get(Chunk, chunk_ids[0], with_for_update=True)
            rows = [{"idx": i, "item_id": f"i{i}", "output": {"label": "a"}} for i in range(2)]
            upsert_results(finishing, job_id, rows)
            deleter = threading.Thread(target=delete_job)
            deleter.start()
            # Until the delete waits on the chunk's lock (Postgres says so), not a sleep.
            deadline = time.monotonic() + 30
            with engine.connect() as watch:
                waiting = text(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid "
                    "AND wait_event_type = 'Lock'"
                )
                while not (backend and watch.scalar(waiting, {"pid": backend[0]})):
                    assert time.monotonic() < deadline, "the delete never waited on the chunk"
                    assert deleter.is_alive(), deleted
                    time.sleep(0.01)
            chunk.state = "done"
        deleter.join(30)
        assert deleted == [None]
        with session_scope(settings) as session:
            assert session.get(Job, job_id) is None
            assert _rows(session, job_id) == (0, 0)
    finally:
        engine.dispose()


def test_on_sqlite_a_deleted_job_takes_its_rows_too(tmp_path):
    """The embedded default: the same trigger, created by the same migration."""
    from core.config.settings import Settings
    from db.migrate import upgrade

    sqlite = Settings.from_env({"LANEWAY_DATABASE_URL": f"sqlite:///{tmp_path / 'l.db'}"})
    upgrade(sqlite)
    gone, kept = _with_results(sqlite, ["a", "b"]), _with_results(sqlite, ["c"])
    with session_scope(sqlite) as session:
        session.execute(delete(Job).where(Job.id == gone))
    with session_scope(sqlite) as session:
        assert _rows(session, gone) == (0, 0) and _rows(session, kept) == (1, 1)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_the_keys_come_back_on_downgrade_without_the_rows_of_deleted_jobs(
    tmp_path, dialect, settings
):
    from alembic import command

    from db.migrate import alembic_config, upgrade
    from tests.conftest import create_database, drop_database

    name = f"laneway_fk_{uuid.uuid4().hex[:8]}"
    url = f"sqlite:///{tmp_path / 'd.db'}" if dialect == "sqlite" else create_database(name)
    try:
        upgrade(url=url)
        engine = create_engine(url)
        try:
            with engine.begin() as conn:
                # An orphan (no job of that id), as nothing but a foreign key would refuse.
                orphan = uuid.uuid4()
                conn.execute(JobItem.__table__.insert(), [
                    {"job_id": orphan, "pos": 0, "idx": 0, "item_id": "x", "text": "t"}
                ])  # fmt: skip
            command.downgrade(alembic_config(url=url), "0013")
            engine.dispose()  # SQLite's pooled connection would keep the old tables' schema
            with engine.connect() as conn:
                keys = {
                    fk["referred_table"]
                    for table in ("job_items", "results")
                    for fk in inspect(conn).get_foreign_keys(table)
                }
                assert keys == {"jobs"}
                assert conn.scalar(select(func.count()).select_from(JobItem.__table__)) == 0
            upgrade(url=url)
            command.check(alembic_config(url=url))
        finally:
            engine.dispose()
    finally:
        if dialect == "postgresql":
            drop_database(name)
