"""Engines and sessions, one engine per process, created lazily (never before a fork)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from core.config.settings import Settings, get_settings
from core.util.jsoncodec import dumps

CONNECT_TIMEOUT = 10  # seconds
# Each process's Postgres pool: steady connections, and how many more a burst may open
# (`laneway plan` counts a fleet's connections from them).
POOL_SIZE = 5
MAX_OVERFLOW = 5


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30}, json_serializer=dumps)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # noqa: ANN001
            # WAL lets the web app read while workers write; foreign keys are off by default.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    # A bounded connect: a Postgres that is gone answers 503 in seconds (webapp/errors.py),
    # not after the operating system's minutes-long TCP timeout. JSON columns (result rows
    # above all) are written as orjson's text: core/util/jsoncodec.py.
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=POOL_SIZE,
        max_overflow=MAX_OVERFLOW,
        connect_args={"connect_timeout": CONNECT_TIMEOUT},
        json_serializer=dumps,
    )


@lru_cache(maxsize=4)
def _factory(url: str, pid: int) -> sessionmaker[Session]:
    # Keyed by pid: a forked child never reuses its parent's pooled connections.
    return sessionmaker(make_engine(url), expire_on_commit=False)


def session_factory(settings: Settings | None = None) -> sessionmaker[Session]:
    settings = settings or get_settings()
    return _factory(settings.database_url, os.getpid())


@contextmanager
def session_scope(settings: Settings | None = None) -> Iterator[Session]:
    """A session whose transaction commits on success and rolls back on error; what was
    handed to `after_commit` runs once the commit has succeeded."""
    with session_factory(settings).begin() as session:
        yield session


# Where a session keeps the callbacks its commit runs (Session.info, one dict per session).
AFTER_COMMIT = "laneway.after_commit"


def after_commit(session: Session, callback: Callable[[], Any]) -> None:
    """Run `callback` once this session's transaction has committed, never if it rolls
    back or its commit fails: a task is sent only after the rows it reads are there
    (pypi/warehouse's `addAfterCommitHook`). Callbacks run in order, in the committing
    thread, outside any transaction (they may open sessions of their own, not use this
    one); one that raises stops the ones after it and reaches the caller of commit."""
    if not session.in_transaction():
        session.begin()  # the callback belongs to a transaction: this one, from now
    session.info.setdefault(AFTER_COMMIT, []).append(callback)


@event.listens_for(Session, "after_commit")
def _run_after_commit(session: Session) -> None:
    for callback in session.info.pop(AFTER_COMMIT, ()):
        callback()


@event.listens_for(Session, "after_soft_rollback")
def _drop_after_commit(session: Session, previous_transaction: Any) -> None:
    # Every rollback of the session's own transaction (also one with nothing begun in the
    # database); a savepoint's rollback leaves the outer transaction's callbacks alone.
    if not previous_transaction.nested:
        session.info.pop(AFTER_COMMIT, None)
