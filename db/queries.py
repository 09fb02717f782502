"""Queries used by more than one room: accounts and keys, job creation, results, progress."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from db.models import FINAL_JOB_STATUSES, Account, ApiKey, Chunk, Job, JobItem, Result

KEY_PREFIX = "lw_"


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(moment: datetime | None) -> datetime | None:
    """SQLite hands timestamps back naive; they were written in UTC."""
    if moment is not None and moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment


# --- accounts and API keys -------------------------------------------------------------


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_account(session: Session, name: str, type_: str) -> tuple[Account, str]:
    """Create an account with one API key; the key is returned once and stored hashed."""
    account = Account(name=name, type=type_)
    session.add(account)
    session.flush()
    return account, add_api_key(session, account)


def add_api_key(session: Session, account: Account) -> str:
    prefix = KEY_PREFIX + secrets.token_hex(4)
    key = f"{prefix}_{secrets.token_urlsafe(32)}"
    session.add(ApiKey(account_id=account.id, prefix=prefix, key_hash=hash_key(key)))
    session.flush()
    return key


def account_for_key(session: Session, key: str) -> Account | None:
    """The account owning a live key, or None; compares hashes in constant time."""
    # lw_<8 hex>_<secret>: the secret itself may contain underscores.
    parts = key.split("_", 2)
    if len(parts) != 3 or f"{parts[0]}_" != KEY_PREFIX:
        return None
    prefix = f"{parts[0]}_{parts[1]}"
    row = session.scalar(select(ApiKey).where(ApiKey.prefix == prefix, ApiKey.revoked_at.is_(None)))
    if row is None or not hmac.compare_digest(row.key_hash, hash_key(key)):
        return None
    return row.account


# --- jobs ---------------------------------------------------------------------------


def create_job(
    session: Session,
    *,
    account_id: int,
    tasks: Sequence[str],
    labels: Sequence[str],
    items: Sequence[tuple[str, str]],
    lane: str,
    chunks: Sequence[tuple[int, int]],
    chunk_size: int,
    source: str = "api",
) -> Job:
    """Write a job, its items (COPY on Postgres) and its chunks; the caller commits."""
    job = Job(
        id=uuid.uuid4(),
        account_id=account_id,
        tasks=list(tasks),
        labels=list(labels),
        status="queued",
        lane=lane,
        source=source,
        total_items=len(items),
        succeeded_items=0,
        failed_items=0,
        chunk_size=chunk_size,
        pre_seconds=0.0,
        model_seconds=0.0,
        post_seconds=0.0,
    )
    session.add(job)
    session.flush()
    bulk_insert_items(session, job.id, items)
    session.execute(
        insert(Chunk),
        [
            {
                "job_id": job.id,
                "seq": seq,
                "start": start,
                "stop": stop,
                "queue": lane,
                "task_id": str(uuid.uuid4()),
                "state": "queued",
                "attempts": 0,
            }
            for seq, (start, stop) in enumerate(chunks)
        ],
    )
    return job


def length_positions(items: Sequence[tuple[str, str]]) -> list[int]:
    """Each item's place in length order (ties keep input order)."""
    order = sorted(range(len(items)), key=lambda i: len(items[i][1]))
    pos = [0] * len(items)
    for p, i in enumerate(order):
        pos[i] = p
    return pos


def bulk_insert_items(
    session: Session, job_id: uuid.UUID, items: Sequence[tuple[str, str]]
) -> None:
    positions = length_positions(items)
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        # COPY is an order of magnitude faster than INSERTs for large uploads.
        raw = conn.connection.driver_connection
        with raw.cursor() as cur:
            with cur.copy("COPY job_items (job_id, idx, pos, item_id, text) FROM STDIN") as copy:
                for idx, (item_id, text) in enumerate(items):
                    copy.write_row((job_id, idx, positions[idx], item_id, text))
        return
    rows = [
        {"job_id": job_id, "idx": idx, "pos": positions[idx], "item_id": item_id, "text": text}
        for idx, (item_id, text) in enumerate(items)
    ]
    if rows:
        session.execute(insert(JobItem), rows)


def chunks_of(session: Session, job_id: uuid.UUID) -> list[Chunk]:
    return list(session.scalars(select(Chunk).where(Chunk.job_id == job_id).order_by(Chunk.seq)))


def chunk_items(session: Session, chunk: Chunk) -> list[Any]:
    """The chunk's items as (idx, item_id, text) rows, in length order."""
    return list(
        session.execute(
            select(JobItem.idx, JobItem.item_id, JobItem.text)
            .where(
                JobItem.job_id == chunk.job_id,
                JobItem.pos >= chunk.start,
                JobItem.pos < chunk.stop,
            )
            .order_by(JobItem.pos)
        )
    )


def mark_job_running(session: Session, job_id: uuid.UUID) -> None:
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == "queued")
        .values(status="running", started_at=utcnow())
    )


def upsert_results(session: Session, job_id: uuid.UUID, rows: Sequence[dict[str, Any]]) -> None:
    """Insert or overwrite results by (job, idx): a redelivered chunk never duplicates one."""
    if not rows:
        return
    dialect = session.connection().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    else:
        from sqlalchemy.dialects.sqlite import insert as dialect_insert
    stmt = dialect_insert(Result)
    stmt = stmt.on_conflict_do_update(
        index_elements=[Result.job_id, Result.idx],
        set_={
            "item_id": stmt.excluded.item_id,
            "label": stmt.excluded.label,
            "output": stmt.excluded.output,
            "error": stmt.excluded.error,
        },
    )
    # executemany: one cached statement, sent in batches (insertmanyvalues).
    session.execute(stmt, [{"job_id": job_id, **row} for row in rows])


def items_done(session: Session, job_id: uuid.UUID) -> int:
    return session.scalar(select(func.count()).where(Result.job_id == job_id)) or 0


def job_cost(
    session: Session, job_id: uuid.UUID, total_items: int, cpu_price: float, gpu_price: float
) -> dict[str, Any]:
    """What the job's chunks cost so far: CPU stages at the CPU price, the model stage at
    the price of the device it ran on (GPU-seconds on CUDA, CPU-seconds otherwise)."""
    rows = session.execute(
        select(
            Chunk.device,
            func.coalesce(func.sum(Chunk.pre_seconds), 0.0),
            func.coalesce(func.sum(Chunk.model_seconds), 0.0),
            func.coalesce(func.sum(Chunk.post_seconds), 0.0),
        )
        .where(Chunk.job_id == job_id)
        .group_by(Chunk.device)
    ).all()
    seconds = {"pre": 0.0, "model_cpu": 0.0, "model_gpu": 0.0, "post": 0.0}
    for device, pre, model, post in rows:
        seconds["pre"] += pre
        seconds["post"] += post
        seconds["model_gpu" if device == "cuda" else "model_cpu"] += model
    by_stage = {
        "pre": seconds["pre"] * cpu_price,
        "model": seconds["model_cpu"] * cpu_price + seconds["model_gpu"] * gpu_price,
        "post": seconds["post"] * cpu_price,
    }
    total = sum(by_stage.values())
    return {
        "currency": "USD",
        "total": round(total, 8),
        "per_item": round(total / total_items, 10) if total_items else 0.0,
        "by_stage": {k: round(v, 8) for k, v in by_stage.items()},
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "prices": {"cpu_second": cpu_price, "gpu_second": gpu_price},
    }


def finalize_job(
    session: Session, job_id: uuid.UUID, cpu_price: float = 0.0, gpu_price: float = 0.0
) -> str | None:
    """Write totals, label counts and model time, and the final status, once.

    Returns the final status, or None when the job was already final (a second call is a
    no-op, so a redelivered or duplicated callback never finalizes a job twice).
    """
    job = session.get(Job, job_id)
    if job is None or job.status in FINAL_JOB_STATUSES:
        return None
    ok = (Result.job_id == job_id, Result.error.is_(None))
    succeeded = session.scalar(select(func.count()).where(*ok)) or 0
    label_counts = None
    if "classify" in job.tasks:
        label_rows = session.execute(
            select(Result.label, func.count()).where(*ok).group_by(Result.label)
        ).all()
        label_counts = {label: n for label, n in sorted(label_rows, key=lambda r: (-r[1], r[0]))}
    # Items with no result at all count as failed: the job must never claim them.
    failed = job.total_items - succeeded
    cost = job_cost(session, job_id, job.total_items, cpu_price, gpu_price)
    stage = cost["seconds"]
    if failed == 0:
        status = "succeeded"
    elif succeeded > 0:
        status = "partial"
    else:
        status = "failed"
    now = utcnow()
    done = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.not_in(FINAL_JOB_STATUSES))
        .values(
            status=status,
            succeeded_items=succeeded,
            failed_items=failed,
            label_counts=label_counts,
            pre_seconds=stage["pre"],
            model_seconds=stage["model_cpu"] + stage["model_gpu"],
            post_seconds=stage["post"],
            cost=cost,
            started_at=func.coalesce(Job.started_at, now),
            finished_at=now,
        )
    )
    return status if done.rowcount == 1 else None


def iter_results(session: Session, job_id: uuid.UUID, batch: int = 1000) -> Iterator[Result]:
    """Results in item order, fetched in pages so a huge job streams in bounded memory."""
    last = -1
    while True:
        page = list(
            session.scalars(
                select(Result)
                .where(Result.job_id == job_id, Result.idx > last)
                .order_by(Result.idx)
                .limit(batch)
            )
        )
        # End the read transaction between pages: a slow download must not hold a
        # connection "idle in transaction" (nor, on SQLite, block WAL checkpoints).
        session.commit()
        if not page:
            return
        yield from page
        last = page[-1].idx
