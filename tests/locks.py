"""Row locks held open on purpose, to force two transactions into one interleaving: a
session of the test's holds some rows while another call runs on a thread, and the test
watches whether that call ends or waits for a lock."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

from sqlalchemy import text
from sqlalchemy.orm import Session

from db.session import session_factory, session_scope


def waiting_on_locks(settings) -> int:
    """Backends of this run's database waiting for a row lock now."""
    with session_scope(settings) as session:
        return session.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
        )


def ends_or_waits(settings, future: Future, bound: float = 60.0) -> bool:
    """Whether `future` ended (True) or waits for a row lock (False); neither within
    `bound` seconds fails the test."""
    deadline = time.monotonic() + bound
    while not future.done() and waiting_on_locks(settings) == 0:
        assert time.monotonic() < deadline, "the call neither ended nor waited"
        time.sleep(0.02)
    return future.done()


@contextmanager
def held(settings) -> Iterator[tuple[Session, ThreadPoolExecutor]]:
    """A session whose locks the test takes, and one thread for the other side. On the
    way out the session closes (a waiting call then gets its locks) and the thread ends."""
    session = session_factory(settings)()
    pool = ThreadPoolExecutor(1)
    try:
        yield session, pool
    finally:
        session.close()
        pool.shutdown()
