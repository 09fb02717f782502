"""Alembic environment: the URL comes from Laneway's settings unless the caller gave one."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from core.config.settings import get_settings
from db.models import Base
from db.session import make_engine

config = context.config
target_metadata = Base.metadata
# Any number: migrations on Postgres hold this advisory lock, so two at once queue up.
MIGRATION_LOCK = 7_331_001


def run_migrations_offline() -> None:
    url = config.get_main_option("sqlalchemy.url") or get_settings().database_url
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        url = config.get_main_option("sqlalchemy.url") or get_settings().database_url
        with make_engine(url).connect() as connection:
            _run(connection)
    else:
        _run(connection)


def _run(connection) -> None:  # noqa: ANN001
    is_pg = connection.dialect.name == "postgresql"
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_server_default=True,
        render_as_batch=not is_pg,  # SQLite alters tables by copying them
    )
    if not is_pg:
        # Batch mode copies a table and drops the old one; with foreign keys on, SQLite
        # cascades that drop into every referencing table (a migration would delete the
        # jobs of an account, or the items of a job). The pragma only works outside a
        # transaction, and is restored for whoever uses this connection next.
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        connection.commit()
    try:
        with context.begin_transaction():
            if is_pg:
                connection.execute(text("SET LOCAL lock_timeout = '10s'"))
                connection.execute(text(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))
            context.run_migrations()
    finally:
        if not is_pg:
            connection.exec_driver_sql("PRAGMA foreign_keys=ON")


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
