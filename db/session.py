"""Engines and sessions, one engine per process, created lazily (never before a fork)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from laneway.jsoncodec import dumps
from laneway.settings import Settings, get_settings

CONNECT_TIMEOUT = 10  # seconds


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
    # above all) are written as orjson's text: laneway/jsoncodec.py.
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=5,
        max_overflow=5,
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
    """A session whose transaction commits on success and rolls back on error."""
    with session_factory(settings).begin() as session:
        yield session
