"""The web app in-process, on the run's real Postgres and Redis."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture(autouse=True)
def _services(services, settings, migrated) -> None:
    """Every test here stands on the run's database and Redis index, asked for or not, and
    starts quiet: no job open, the queues empty. No worker ends the jobs these tests store,
    so the chunks earlier tests left in flight would otherwise fill the lanes' windows (fair
    share sends a lane only a few chunks at a time) and keep the next test's chunks
    waiting, by the order the tests happen to run in (which pytest-xdist's workers change)."""
    from tests.broker import quiesce

    quiesce(settings, unacked=True)


@pytest.fixture
def no_worker_up(settings) -> None:
    """No worker process counts as up (earlier tests register some, and a worker serving a
    lane widens its fair-share window): each lane's window is LANEWAY_MIN_WINDOW."""
    from sqlalchemy import update

    from db.common import utcnow
    from db.models import Worker
    from db.session import session_scope

    with session_scope(settings) as session:
        session.execute(
            update(Worker).where(Worker.stopped_at.is_(None)).values(stopped_at=utcnow())
        )


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def store_results(job_id: str, rows: list[dict]) -> None:
    """Write results as a worker would (no worker runs in these tests)."""
    from db.results import upsert_results
    from db.session import session_scope

    with session_scope() as session:
        upsert_results(session, uuid.UUID(job_id), rows)


@pytest.fixture
def make_app(settings, migrated):
    """Build an app, optionally with settings changed (e.g. lower limits)."""
    from webapp import create_app

    def make(**changes):
        return create_app(settings.replace(**changes) if changes else settings)

    return make


@pytest.fixture
def app(make_app):
    # Every test here calls from 127.0.0.1: a shared per-address budget for requests
    # without a key would make tests fail by the order they run in. Tests of that limit
    # build their own app.
    return make_app(anonymous_rate_limit="100000/minute")


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def served(app):
    """The app served over real HTTP on a free local port (werkzeug, threaded), for clients
    that open their own connections (the async client, the CLI). Yields its URL."""
    import threading

    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
