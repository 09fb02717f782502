"""Small queries and helpers every subject module and room shares: the clock, a job's
events, and reads of its chunks, items and workers."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from db.models import Chunk, Job, JobEvent, JobItem, Worker

# A job is settled, and may be finalized, once none of its chunks is in these states.
UNSETTLED_CHUNK_STATES = ("held", "queued", "running")


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(moment: datetime | None) -> datetime | None:
    """SQLite hands timestamps back naive; they were written in UTC."""
    if moment is not None and moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment


def alive_workers(
    session: Session, dead_after: float, lane: str | None = None, since: datetime | None = None
) -> list[Worker]:
    """Worker processes that beat within `dead_after` seconds (or since `since`) and did
    not stop, by host and start; with `lane`, those consuming that queue."""
    since = since or utcnow() - timedelta(seconds=dead_after)
    rows = session.scalars(
        select(Worker)
        .where(Worker.stopped_at.is_(None), Worker.last_seen_at >= since)
        .order_by(Worker.hostname, Worker.started_at)
    ).all()
    return [w for w in rows if lane is None or lane in w.queues]


def record_event(
    session: Session, job_id: uuid.UUID, kind: str, detail: dict[str, Any] | None = None
) -> None:
    session.add(JobEvent(job_id=job_id, kind=kind, detail=detail))


def own_job(session: Session, account_id: int, job_id: uuid.UUID) -> Job | None:
    """The account's job, or None: another account's job is indistinguishable from none."""
    return session.scalar(select(Job).where(Job.id == job_id, Job.account_id == account_id))


def chunks_of(session: Session, job_id: uuid.UUID) -> list[Chunk]:
    return list(session.scalars(select(Chunk).where(Chunk.job_id == job_id).order_by(Chunk.seq)))


def chunk_items(session: Session, chunk: Chunk) -> list[Any]:
    """The chunk's items as (idx, item_id, text) rows, in length order: its range of
    positions, or the items it names (a retry chunk). Read on the session's connection
    without the ORM's loading (rows of plain columns, thousands a chunk), and without a
    flush: no pending change touches job_items."""
    where = (
        [JobItem.pos.in_(chunk.positions)]
        if chunk.positions is not None
        else [JobItem.pos >= chunk.start, JobItem.pos < chunk.stop]
    )
    return list(
        session.connection().execute(
            select(JobItem.idx, JobItem.item_id, JobItem.text)
            .where(JobItem.job_id == chunk.job_id, *where)
            .order_by(JobItem.pos)
        )
    )


def mark_job_running(session: Session, job_id: uuid.UUID) -> None:
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == "queued")
        .values(status="running", started_at=utcnow())
    )
