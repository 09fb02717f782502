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
