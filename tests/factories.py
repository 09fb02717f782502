"""Jobs written straight to the database, as submission writes them (no web app, no broker),
and worker processes as their heartbeats register them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine

from db.accounts import create_account
from db.common import chunks_of, utcnow
from db.intake import create_job
from db.models import Worker
from db.session import session_scope
from jobs.planner import plan_chunks


def stored_job(
    settings,
    texts: Sequence[str],
    *,
    lane: str = "cpu",
    chunk_size: int = 16,
    account_type: str = "standard",
    tasks: Sequence[str] = ("classify",),
    labels: Sequence[str] = ("shipping", "billing", "bug", "praise", "account"),
    held: bool = False,
    prefix: str = "i",
) -> tuple[uuid.UUID, list[int]]:
    """A committed job of one account of its own; returns its id and its chunks' ids."""
    with session_scope(settings) as session:
        account, _ = create_account(session, f"{prefix}-{uuid.uuid4().hex[:8]}", account_type)
        job = create_job(
            session,
            account_id=account.id,
            tasks=list(tasks),
            labels=list(labels),
            items=[(f"{prefix}{i}", t) for i, t in enumerate(texts)],
            lane=lane,
            chunks=plan_chunks(len(texts), chunk_size),
            chunk_size=chunk_size,
            held=held,
        )
        return job.id, [c.id for c in chunks_of(session, job.id)]


def add_worker(settings, queues, *, idle_for=0.0, running=0, seen_ago=0.0) -> str:
    """A registered worker process consuming `queues`, last heard from `seen_ago` s ago."""
    instance = f"test/{uuid.uuid4().hex[:8]}"
    now = utcnow()
    with session_scope(settings) as session:
        session.add(
            Worker(
                id=instance,
                hostname=f"{queues[0]}-{instance[-4:]}@test",
                queues=queues,
                device="cpu",
                pid=1,
                last_seen_at=now - timedelta(seconds=seen_ago),
                idle_since=now - timedelta(seconds=idle_for),
                running_tasks=running,
            )
        )
    return instance


@contextmanager
def sqlite_with_account(path: Path, name: str = "a") -> Iterator[tuple[Engine, int]]:
    """A new SQLite database at `path`, migrated, with one committed account: its engine
    (disposed afterwards) and the account's id."""
    from sqlalchemy.orm import Session

    from db.migrate import upgrade
    from db.session import make_engine

    url = f"sqlite:///{path}"
    upgrade(url=url)
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            account, _ = create_account(session, name, "standard")
            session.commit()
            account_id = account.id
        yield engine, account_id
    finally:
        engine.dispose()
