"""Alembic: one head, no drift between models and migrations, upgrade of empty databases."""

import uuid

from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from db.migrate import alembic_config, upgrade
from db.models import Base
from tests.conftest import create_database, drop_database


def test_exactly_one_head():
    heads = ScriptDirectory.from_config(alembic_config(url="sqlite://")).get_heads()
    assert len(heads) == 1


def test_upgrade_empty_postgres_then_no_drift():
    name = f"laneway_mig_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    try:
        upgrade(url=url)
        engine = create_engine(url)
        try:
            tables = set(inspect(engine).get_table_names())
        finally:
            engine.dispose()
        assert set(Base.metadata.tables) <= tables
        command.check(alembic_config(url=url))  # raises if models and migrations differ
    finally:
        drop_database(name)


def test_upgrade_empty_sqlite_then_no_drift(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    upgrade(url=url)
    command.check(alembic_config(url=url))


def test_upgrade_keeps_existing_jobs_and_downgrades(tmp_path):
    """0001 -> head turns a job's `task` into `tasks`; head -> 0001 -> head round-trips."""
    from sqlalchemy import text

    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url=url, revision="0001")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO accounts (name, type) VALUES ('old', 'standard')"))
            conn.execute(
                text(
                    "INSERT INTO jobs (id, account_id, task, labels, status, lane, source, "
                    "total_items, succeeded_items, failed_items, chunk_size, model_seconds) "
                    "VALUES (:id, 1, 'classify', '[]', 'succeeded', 'cpu', 'api', 1, 1, 0, 1, 0.5)"
                ),
                {"id": uuid.uuid4().hex},
            )
        upgrade(url=url)
        with engine.connect() as conn:
            tasks, pre = conn.execute(text("SELECT tasks, pre_seconds FROM jobs")).one()
        assert tasks == '["classify"]' and pre == 0
        command.downgrade(alembic_config(url=url), "0001")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT task FROM jobs")).scalar() == "classify"
        upgrade(url=url)
        command.check(alembic_config(url=url))
    finally:
        engine.dispose()
