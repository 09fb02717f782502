"""An account's jobs, newest first, a page at a time (keyset pagination).

A page ends at a (created_at, id) position and the next starts strictly after it, so jobs
submitted while a caller pages through are never shown twice nor make another skipped:
they sort before the first page.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from db.models import Job


def list_jobs(
    session: Session,
    account_id: int,
    limit: int,
    after: tuple[datetime, uuid.UUID] | None = None,
    statuses: Sequence[str] = (),
) -> list[Job]:
    """Up to `limit` of the account's jobs, newest first, after the position `after`."""
    query = select(Job).where(Job.account_id == account_id)
    if statuses:
        query = query.where(Job.status.in_(statuses))
    if after is not None:
        created, job_id = after
        query = query.where(
            or_(Job.created_at < created, and_(Job.created_at == created, Job.id < job_id))
        )
    query = query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit)
    return list(session.scalars(query))
