"""Queries used by more than one room: accounts and keys, job creation, results, progress."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    Uuid,
    exists,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.orm import Session
from sqlalchemy.schema import CreateTable

from core.util import pricing
from db.models import (
    FINAL_JOB_STATUSES,
    Account,
    ApiKey,
    Chunk,
    Job,
    JobEvent,
    JobItem,
    Result,
    Worker,
)

# A job is settled, and may be finalized, once none of its chunks is in these states.
UNSETTLED_CHUNK_STATES = ("held", "queued", "running")

KEY_PREFIX = "lw_"
KEY_PREFIX_SHAPE = re.compile(r"lw_[0-9a-f]{1,13}")


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


def create_account(
    session: Session,
    name: str,
    type_: str,
    *,
    is_admin: bool = False,
    key_name: str | None = None,
) -> tuple[Account, str]:
    """Create an account with one API key; the key is returned once and stored hashed."""
    account = Account(name=name, type=type_, is_admin=is_admin)
    session.add(account)
    session.flush()
    return account, add_api_key(session, account, key_name)[1]


def add_api_key(session: Session, account: Account, name: str | None = None) -> tuple[ApiKey, str]:
    """A new key for the account: the row, and the key itself (shown once, never stored)."""
    # lw_ + 12 hex: 48 bits, so prefixes stay unique across millions of keys.
    prefix = KEY_PREFIX + secrets.token_hex(6)
    key = f"{prefix}_{secrets.token_urlsafe(32)}"
    row = ApiKey(account_id=account.id, prefix=prefix, key_hash=hash_key(key), name=name)
    session.add(row)
    session.flush()
    return row, key


def key_prefix(key: str) -> str | None:
    """The public prefix of a key (lw_<hex>), or None when it is not shaped like one."""
    # lw_<hex>_<secret>: the secret itself may contain underscores.
    parts = key.split("_", 2)
    if len(parts) != 3 or not parts[2]:
        return None
    prefix = f"{parts[0]}_{parts[1]}"
    # Anything else never reaches the database (a NUL in a query is an error, not a miss).
    return prefix if KEY_PREFIX_SHAPE.fullmatch(prefix) else None


def is_live(row: ApiKey, now: datetime | None = None) -> bool:
    """A key is live until its revocation moment, which rotation may set in the future."""
    return row.revoked_at is None or aware(row.revoked_at) > (now or utcnow())


def live_key(session: Session, key: str) -> ApiKey | None:
    """The live key row matching a key, or None; compares hashes in constant time."""
    prefix = key_prefix(key)
    if prefix is None:
        return None
    row = session.scalar(select(ApiKey).where(ApiKey.prefix == prefix))
    if row is None or not hmac.compare_digest(row.key_hash, hash_key(key)) or not is_live(row):
        return None
    return row


def account_for_key(session: Session, key: str) -> Account | None:
    """The account owning a live key, or None."""
    row = live_key(session, key)
    return row.account if row is not None else None


def list_accounts(session: Session) -> list[Account]:
    return list(session.scalars(select(Account).order_by(Account.id)))


def find_account(session: Session, ref: str) -> Account | None:
    """An account by its name, or by its id when `ref` is all digits."""
    if ref.isdigit():
        return session.get(Account, int(ref))
    return session.scalar(select(Account).where(Account.name == ref))


def list_keys(session: Session, account_id: int) -> list[ApiKey]:
    return list(
        session.scalars(select(ApiKey).where(ApiKey.account_id == account_id).order_by(ApiKey.id))
    )


def find_key(session: Session, prefix: str) -> ApiKey | None:
    """The key with this prefix, revoked or not; None for anything not shaped like one."""
    if not KEY_PREFIX_SHAPE.fullmatch(prefix):
        return None
    return session.scalar(select(ApiKey).where(ApiKey.prefix == prefix))


def revoke_key(session: Session, row: ApiKey, grace_seconds: int = 0) -> None:
    """Revoke a key now, or after a grace period; an earlier revocation stands."""
    at = utcnow() + timedelta(seconds=grace_seconds)
    if row.revoked_at is None or aware(row.revoked_at) > at:
        row.revoked_at = at
    session.flush()


def rotate_key(session: Session, row: ApiKey, grace_seconds: int = 0) -> tuple[ApiKey, str]:
    """Replace a key: a new one for the same account and name, the old one revoked after
    the grace period (0: at once)."""
    new_row, key = add_api_key(session, row.account, row.name)
    revoke_key(session, row, grace_seconds)
    return new_row, key


# --- jobs ---------------------------------------------------------------------------


# Items pass through a temporary table on their way to job_items: they arrive in input
# order, one at a time, and each needs its place in length order (`pos`), known only once
# all have arrived. One INSERT ... SELECT then sorts them in the database, so this process
# never holds them (docs/benchmarks.md: bench/ingest.py).
STAGED = Table(
    "laneway_staged_items",
    MetaData(),
    Column("idx", Integer, nullable=False),
    Column("place", Integer, nullable=False),
    Column("item_id", String(200), nullable=False),
    Column("text", Text, nullable=False),
    prefixes=["TEMPORARY"],
)
SQLITE_BATCH = 5000
CHUNK_BATCH = 1000  # chunk rows per INSERT: a million items make 3,907 chunks of 256


@dataclass(frozen=True)
class Staged:
    """Items waiting in this transaction's temporary table for their job."""

    count: int


class DuplicateItem(ValueError):
    """Two staged items share an id: `place` repeats the id first seen at `first`."""

    def __init__(self, item_id: str, place: int, first: int) -> None:
        super().__init__(f"duplicate id {item_id!r}")
        self.item_id, self.place, self.first = item_id, place, first


def _create_staged(session: Session) -> None:
    conn = session.connection()
    ddl = str(CreateTable(STAGED).compile(dialect=conn.dialect)).strip()
    if conn.dialect.name == "postgresql":
        # One round trip; gone at commit (or with a rollback).
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {STAGED.name}; {ddl} ON COMMIT DROP")
    else:
        # pysqlite runs DDL outside the transaction: a table left by a rolled-back job
        # may still be there.
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS temp.{STAGED.name}")
        conn.exec_driver_sql(ddl)


def stage_items(
    session: Session,
    rows: Iterable[tuple[str, str, int]],
    progress: Callable[[int], None] | None = None,
    every: int = 100_000,
) -> Staged:
    """Write (id, text, place) rows into the temporary table as they come (COPY on
    Postgres, batched executemany on SQLite); `progress` hears the count every `every`."""
    _create_staged(session)
    conn = session.connection()
    count = 0
    if conn.dialect.name == "postgresql":
        raw = conn.connection.driver_connection
        columns = ", ".join(c.name for c in STAGED.columns)
        with raw.cursor() as cur, cur.copy(f"COPY {STAGED.name} ({columns}) FROM STDIN") as copy:
            for item_id, item_text, place in rows:
                copy.write_row((count, place, item_id, item_text))
                count += 1
                if progress is not None and count % every == 0:
                    progress(count)
        return Staged(count)
    sql = f"INSERT INTO {STAGED.name} VALUES (?, ?, ?, ?)"
    batch: list[tuple[int, int, str, str]] = []
    for item_id, item_text, place in rows:
        batch.append((count, place, item_id, item_text))
        count += 1
        if len(batch) >= SQLITE_BATCH:
            conn.exec_driver_sql(sql, batch)
            batch.clear()
        if progress is not None and count % every == 0:
            progress(count)
    if batch:
        conn.exec_driver_sql(sql, batch)
    return Staged(count)


def _first_duplicate(session: Session) -> DuplicateItem:
    """The first staged item, in input order, whose id came before."""
    t = STAGED.c
    ranked = select(
        t.item_id,
        t.place,
        func.row_number().over(partition_by=t.item_id, order_by=t.idx).label("n"),
        func.min(t.place).over(partition_by=t.item_id).label("first"),
    ).subquery()
    row = session.execute(
        select(ranked.c.item_id, ranked.c.place, ranked.c.first)
        .where(ranked.c.n == 2)
        .order_by(ranked.c.place)
        .limit(1)
    ).one()
    return DuplicateItem(row.item_id, row.place, row.first)


def create_job(
    session: Session,
    *,
    account_id: int,
    tasks: Sequence[str],
    labels: Sequence[str],
    items: Staged | Iterable[tuple[str, str]],
    lane: str,
    chunks: Sequence[tuple[int, int]],
    chunk_size: int,
    source: str = "api",
    held: bool = False,
    routing: dict[str, Any] | None = None,
) -> Job:
    """Write a job, its items and its chunks; the caller commits. `items` are either
    staged already (stage_items) or (id, text) pairs staged here. Raises DuplicateItem
    (and writes no item) when two items share an id. A held job (its lane is full) waits,
    chunks and all, until the reconciler releases it."""
    if not isinstance(items, Staged):
        items = stage_items(session, ((i, t, n) for n, (i, t) in enumerate(items)))
    job = Job(
        id=uuid.uuid4(),
        account_id=account_id,
        tasks=list(tasks),
        labels=list(labels),
        status="held" if held else "queued",
        lane=lane,
        routing=routing,
        source=source,
        total_items=items.count,
        succeeded_items=0,
        failed_items=0,
        cancelled_items=0,
        chunk_size=chunk_size,
        pre_seconds=0.0,
        model_seconds=0.0,
        post_seconds=0.0,
    )
    session.add(job)
    session.flush()
    t = STAGED.c
    # Each item's place in length order, ties in input order; nothing at all when an id
    # repeats (one hash aggregate, computed once, in the same statement).
    pos = func.row_number().over(order_by=(func.length(t.text), t.idx)) - 1
    repeated = select(t.item_id).group_by(t.item_id).having(func.count() > 1)
    written = session.execute(
        insert(JobItem)
        .from_select(
            ["job_id", "idx", "pos", "item_id", "text"],
            select(literal(job.id, Uuid), t.idx, pos, t.item_id, t.text).where(~repeated.exists()),
        )
        .execution_options(preserve_rowcount=True)  # kept for UPDATEs only unless asked
    ).rowcount
    if written != items.count:
        raise _first_duplicate(session)
    if session.connection().dialect.name != "postgresql":
        session.connection().exec_driver_sql(f"DROP TABLE temp.{STAGED.name}")
    for first in range(0, len(chunks), CHUNK_BATCH):
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
                    "state": "held" if held else "queued",
                    "stage": first_stage(lane),
                    "attempts": 0,
                }
                for seq, (start, stop) in enumerate(
                    chunks[first : first + CHUNK_BATCH], start=first
                )
            ],
        )
    if held:
        record_event(session, job.id, "held", {"lane": lane})
    return job


def first_stage(lane: str) -> str:
    """cpu chunks run in one task; gpu chunks start with pre-processing on a cpu worker."""
    return "run" if lane == "cpu" else "prep"


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


class ChunkRef(NamedTuple):
    """What sending a chunk needs: a few bytes per chunk, not an ORM object."""

    id: int
    task_id: str
    stage: str


def chunk_refs(session: Session, job_id: uuid.UUID) -> list[ChunkRef]:
    rows = session.execute(
        select(Chunk.id, Chunk.task_id, Chunk.stage)
        .where(Chunk.job_id == job_id)
        .order_by(Chunk.seq)
    )
    return [ChunkRef(*row) for row in rows]


def own_job(session: Session, account_id: int, job_id: uuid.UUID) -> Job | None:
    """The account's job, or None: another account's job is indistinguishable from none."""
    return session.scalar(select(Job).where(Job.id == job_id, Job.account_id == account_id))


def chunks_of(session: Session, job_id: uuid.UUID) -> list[Chunk]:
    return list(session.scalars(select(Chunk).where(Chunk.job_id == job_id).order_by(Chunk.seq)))


def chunk_items(session: Session, chunk: Chunk) -> list[Any]:
    """The chunk's items as (idx, item_id, text) rows, in length order: its range of
    positions, or the items it names (a retry chunk)."""
    where = (
        [JobItem.pos.in_(chunk.positions)]
        if chunk.positions is not None
        else [JobItem.pos >= chunk.start, JobItem.pos < chunk.stop]
    )
    return list(
        session.execute(
            select(JobItem.idx, JobItem.item_id, JobItem.text)
            .where(JobItem.job_id == chunk.job_id, *where)
            .order_by(JobItem.pos)
        )
    )


def job_settled(session: Session, job_id: uuid.UUID) -> bool:
    """True when no chunk of the job is held, queued or running."""
    open_chunk = exists().where(Chunk.job_id == job_id, Chunk.state.in_(UNSETTLED_CHUNK_STATES))
    return not session.scalar(select(open_chunk))


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
    by_stage = {"pre": 0.0, "model": 0.0, "post": 0.0}
    for device, pre, model, post in rows:
        seconds["pre"] += pre
        seconds["post"] += post
        seconds["model_gpu" if device == "cuda" else "model_cpu"] += model
        by_stage["pre"] += pricing.cost(pre, 0.0, device, cpu_price, gpu_price)
        by_stage["model"] += pricing.cost(0.0, model, device, cpu_price, gpu_price)
        by_stage["post"] += pricing.cost(post, 0.0, device, cpu_price, gpu_price)
    total = sum(by_stage.values())
    return {
        "currency": "USD",
        "total": round(total, 8),
        "per_item": round(total / total_items, 10) if total_items else 0.0,
        "by_stage": {k: round(v, 8) for k, v in by_stage.items()},
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "prices": {"cpu_second": cpu_price, "gpu_second": gpu_price},
    }


def job_runtimes(session: Session, job_id: uuid.UUID) -> list[dict[str, Any]]:
    """What the job's chunks ran with: per runtime, its precision and device, the chunks and
    their model seconds, most chunks first."""
    rows = session.execute(
        select(
            Chunk.runtime,
            Chunk.precision,
            Chunk.device,
            func.count(),
            func.coalesce(func.sum(Chunk.model_seconds), 0.0),
        )
        .where(Chunk.job_id == job_id, Chunk.runtime.is_not(None))
        .group_by(Chunk.runtime, Chunk.precision, Chunk.device)
    ).all()
    found = [
        {
            "runtime": runtime,
            "precision": precision,
            "device": device,
            "chunks": chunks,
            "model_seconds": round(seconds, 3),
        }
        for runtime, precision, device, chunks, seconds in rows
    ]
    return sorted(found, key=lambda r: (-r["chunks"], r["runtime"]))


def finalize_job(
    session: Session, job_id: uuid.UUID, cpu_price: float = 0.0, gpu_price: float = 0.0
) -> str | None:
    """Write totals, label counts and model time, and the final status, once.

    Returns the final status, or None when the job was already final or is not settled
    yet (a chunk is still held, queued or running). A second call is a no-op, so a
    redelivered callback, the reconciler and a last chunk never finalize a job twice.
    """
    job = session.get(Job, job_id)
    if job is None or job.status in (*FINAL_JOB_STATUSES, "held"):
        return None
    if not job_settled(session, job_id):
        return None
    ok = (Result.job_id == job_id, Result.error.is_(None))
    succeeded = session.scalar(select(func.count()).where(*ok)) or 0
    label_counts = None
    if "classify" in job.tasks:
        label_rows = session.execute(
            select(Result.label, func.count()).where(*ok).group_by(Result.label)
        ).all()
        label_counts = {label: n for label, n in sorted(label_rows, key=lambda r: (-r[1], r[0]))}
    cancelled = 0
    if job.cancel_requested_at is not None:
        # Items a cancelled job never reached are cancelled, not failed.
        failed = (
            session.scalar(
                select(func.count()).where(Result.job_id == job_id, Result.error.is_not(None))
            )
            or 0
        )
        cancelled = job.total_items - succeeded - failed
        status = "cancelled"
    else:
        # Items with no result at all count as failed: the job must never claim them.
        failed = job.total_items - succeeded
        status = "succeeded" if failed == 0 else "partial" if succeeded > 0 else "failed"
    cost = job_cost(session, job_id, job.total_items, cpu_price, gpu_price)
    stage = cost["seconds"]
    now = utcnow()
    done = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.not_in(FINAL_JOB_STATUSES))
        .values(
            status=status,
            succeeded_items=succeeded,
            failed_items=failed,
            cancelled_items=cancelled,
            label_counts=label_counts,
            pre_seconds=stage["pre"],
            model_seconds=stage["model_cpu"] + stage["model_gpu"],
            post_seconds=stage["post"],
            cost=cost,
            started_at=func.coalesce(Job.started_at, now),
            finished_at=now,
        )
    )
    if done.rowcount != 1:
        return None
    record_event(
        session,
        job_id,
        "finalized",
        {"status": status, "succeeded": succeeded, "failed": failed, "cancelled": cancelled},
    )
    return status


def iter_results(
    session: Session, job_id: uuid.UUID, batch: int = 1000, failed_only: bool = False
) -> Iterator[Result]:
    """Results in item order (only the failed items' with failed_only), fetched in pages so
    a huge job streams in bounded memory."""
    last = -1
    only = (Result.error.is_not(None),) if failed_only else ()
    while True:
        page = list(
            session.scalars(
                select(Result)
                .where(Result.job_id == job_id, Result.idx > last, *only)
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


def failure_summary(session: Session, job_id: uuid.UUID, total: int, limit: int = 20) -> dict:
    """How the job's items failed: the count, the commonest errors, the first examples;
    items that never got a result count as failed without an error."""
    errors = session.execute(
        select(Result.error, func.count())
        .where(Result.job_id == job_id, Result.error.is_not(None))
        .group_by(Result.error)
        .order_by(func.count().desc(), Result.error)
    ).all()
    examples = session.execute(
        select(Result.item_id, Result.error)
        .where(Result.job_id == job_id, Result.error.is_not(None))
        .order_by(Result.idx)
        .limit(limit)
    ).all()
    recorded = sum(n for _, n in errors)
    ok = session.scalar(select(func.count()).where(Result.job_id == job_id, Result.error.is_(None)))
    return {
        "count": total - (ok or 0),
        "without_result": total - (ok or 0) - recorded,
        "by_error": {error: n for error, n in errors[:limit]},
        "examples": [{"id": item_id, "error": error} for item_id, error in examples],
    }
