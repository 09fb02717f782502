"""Idempotency keys of job submissions (`Idempotency-Key`, per account).

A key is claimed before its job is stored: the row's primary key (account, key) makes a
second request with the same key wait for the first's commit and then find its row, so
two retries racing never store two jobs. The claim is bound to the job once it is stored,
or released when the submission is refused (bad input, a full lane), so the caller may
send it again.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from db.models import IdempotencyKey

# How long a key keeps answering with its job: long enough for any client's retries
# (Stripe keeps its keys 24 hours).
IDEMPOTENCY_TTL = timedelta(hours=24)


def claim(
    session: Session, account_id: int, key: str, body_sha256: str, ttl: timedelta = IDEMPOTENCY_TTL
) -> IdempotencyKey | None:
    """Claim `key` for this request and commit: None when it is now this request's, the
    row that holds it otherwise (its job_id is None while that request is still storing
    its job). This key's expired row goes in the same transaction, so an expired key is
    claimed afresh; the others' are swept by the reconciler (`sweep`), off this path."""
    now = datetime.now(UTC)
    session.execute(
        delete(IdempotencyKey).where(
            IdempotencyKey.account_id == account_id,
            IdempotencyKey.key == key,
            IdempotencyKey.expires_at <= now,
        )
    )
    try:
        session.add(
            IdempotencyKey(
                account_id=account_id, key=key, body_sha256=body_sha256, expires_at=now + ttl
            )
        )
        session.commit()
    except IntegrityError:
        session.rollback()
        return session.scalar(
            select(IdempotencyKey).where(
                IdempotencyKey.account_id == account_id, IdempotencyKey.key == key
            )
        )
    return None


def bind(session: Session, account_id: int, key: str, job_id: uuid.UUID) -> None:
    """Record the job the claimed key stored, and commit."""
    session.execute(
        update(IdempotencyKey)
        .where(IdempotencyKey.account_id == account_id, IdempotencyKey.key == key)
        .values(job_id=job_id)
    )
    session.commit()


def release(session: Session, account_id: int, key: str) -> None:
    """Give up a claim whose submission stored nothing, and commit."""
    session.execute(
        delete(IdempotencyKey).where(
            IdempotencyKey.account_id == account_id,
            IdempotencyKey.key == key,
            IdempotencyKey.job_id.is_(None),
        )
    )
    session.commit()


def sweep(session: Session) -> int:
    """Delete every expired key (the reconciler's round); returns how many went."""
    gone = session.execute(
        delete(IdempotencyKey).where(IdempotencyKey.expires_at <= datetime.now(UTC))
    )
    return gone.rowcount or 0
