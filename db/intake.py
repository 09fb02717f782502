"""A job's intake: a file's items staged as they arrive (or a JSON body's, already in
memory, collected), then the job, its items (in length order) and its chunks written in one
transaction."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    Uuid,
    func,
    insert,
    literal,
    select,
)
from sqlalchemy.orm import Session
from sqlalchemy.schema import CreateTable

from db.models import Chunk, Job, JobItem

# Items pass through a temporary table on their way to job_items: they arrive in input
# order, one at a time, and each needs its place in length order (`pos`), known only once
# all have arrived. One INSERT ... SELECT then sorts them in the database, so this process
# never holds them.
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
# The most items of a body in memory the intake collects (`collect_items`): each costs the
# web process a few hundred bytes more while the job is written, beside what parsing it
# took (webapp/jsonbudget.py bounds that); a larger body streams through the temporary
# table as a file does.
COLLECT_MAX_ITEMS = 200_000
CHUNK_BATCH = 1000  # chunk rows per INSERT: a million items make 3,907 chunks of 256


@dataclass(frozen=True)
class Staged:
    """Items waiting in this transaction's temporary table for their job."""

    count: int


@dataclass(frozen=True)
class Collected:
    """Items this process holds already (a JSON body's, parsed in memory): written straight
    into job_items with their places in length order, without the temporary table and the
    INSERT ... SELECT that sorts a stream's items in the database."""

    rows: list[tuple[str, str, int]]  # (id, text, place)

    @property
    def count(self) -> int:
        return len(self.rows)


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
    if session.connection().dialect.name == "sqlite":
        hold_write_lock(session)
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


def collect_items(
    session: Session,
    rows: Iterable[tuple[str, str, int]],
    progress: Callable[[int], None] | None = None,
    every: int = 100_000,
) -> Collected:
    """The (id, text, place) rows of a body already in memory, collected as they are
    checked; `progress` hears the count every `every`."""
    if session.connection().dialect.name == "sqlite":
        hold_write_lock(session)  # the routing's reads come before the job's writes
    collected: list[tuple[str, str, int]] = []
    for row in rows:
        collected.append(row)
        if progress is not None and len(collected) % every == 0:
            progress(len(collected))
    return Collected(collected)


def _write_collected(session: Session, job_id: uuid.UUID, items: Collected) -> None:
    """Write collected items into job_items: each one's place in length order (ties in input
    order), as the staged path's INSERT ... SELECT computes it; DuplicateItem, before any
    row is written, when an id repeats."""
    first: dict[str, int] = {}
    for item_id, _, place in items.rows:
        seen = first.setdefault(item_id, place)
        if seen != place:
            raise DuplicateItem(item_id, place, seen)
    rows = items.rows
    # Postgres' length() counts characters, as len() does; the sort is stable (ties stay in
    # input order). In length order, the chunks' ranges of `pos` lie together on disk as
    # the staged path's do.
    order = sorted(range(len(rows)), key=[len(text) for _, text, _ in rows].__getitem__)
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        raw = conn.connection.driver_connection
        sql = "COPY job_items (job_id, idx, pos, item_id, text) FROM STDIN"
        with raw.cursor() as cur, cur.copy(sql) as copy:
            for pos, n in enumerate(order):
                copy.write_row((job_id, n, pos, rows[n][0], rows[n][1]))
        return
    sql = "INSERT INTO job_items (job_id, idx, pos, item_id, text) VALUES (?, ?, ?, ?, ?)"
    key = job_id.hex  # SQLAlchemy's Uuid stores it so on SQLite
    for start in range(0, len(order), SQLITE_BATCH):
        batch = order[start : start + SQLITE_BATCH]
        conn.exec_driver_sql(
            sql, [(key, n, start + k, rows[n][0], rows[n][1]) for k, n in enumerate(batch)]
        )


def hold_write_lock(session: Session) -> None:
    """SQLite: begin the transaction holding the database's write lock (waiting for it as
    for any write). The temporary table's statements read the main database's schema,
    which opens a read snapshot; the job's rows, written after the routing's reads, would
    then fail at once ("database is locked", never waiting) had any other process (a
    worker's heartbeat) written in between. A transaction already under way began with a
    write (pysqlite begins one only so), which took the lock."""
    raw = session.connection().connection.driver_connection
    if not raw.in_transaction:
        session.connection().exec_driver_sql("BEGIN IMMEDIATE")


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
    items: Staged | Collected | Iterable[tuple[str, str]],
    lane: str,
    chunks: Sequence[tuple[int, int]],
    chunk_size: int,
    source: str = "api",
    held: bool = False,
    routing: dict[str, Any] | None = None,
) -> Job:
    """Write a job, its items and its chunks; the caller commits. `items` are either
    staged already (stage_items), collected (collect_items), or (id, text) pairs staged here.
    Raises DuplicateItem
    (and writes no item) when two items share an id. With `held` (every job submitted)
    its chunks wait for slots on the lane (jobs/fairshare.py); without, they are queued
    at once, for the caller to send."""
    if not isinstance(items, Staged | Collected):
        items = stage_items(session, ((i, t, n) for n, (i, t) in enumerate(items)))
    job = Job(
        id=uuid.uuid4(),
        account_id=account_id,
        tasks=list(tasks),
        labels=list(labels),
        status="queued",
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
    if isinstance(items, Collected):
        _write_collected(session, job.id, items)
    else:
        _write_staged(session, job.id, items)
    _write_chunks(session, job.id, lane, chunks, held)
    return job


def _write_staged(session: Session, job_id: uuid.UUID, items: Staged) -> None:
    """The staged items into job_items, sorted in the database; DuplicateItem (and no item
    written) when an id repeats."""
    t = STAGED.c
    # Each item's place in length order, ties in input order; nothing at all when an id
    # repeats (one hash aggregate, computed once, in the same statement).
    pos = func.row_number().over(order_by=(func.length(t.text), t.idx)) - 1
    repeated = select(t.item_id).group_by(t.item_id).having(func.count() > 1)
    written = session.execute(
        insert(JobItem)
        .from_select(
            ["job_id", "idx", "pos", "item_id", "text"],
            select(literal(job_id, Uuid), t.idx, pos, t.item_id, t.text).where(~repeated.exists()),
        )
        .execution_options(preserve_rowcount=True)  # kept for UPDATEs only unless asked
    ).rowcount
    if written != items.count:
        raise _first_duplicate(session)
    if session.connection().dialect.name != "postgresql":
        session.connection().exec_driver_sql(f"DROP TABLE temp.{STAGED.name}")


def _write_chunks(
    session: Session,
    job_id: uuid.UUID,
    lane: str,
    chunks: Sequence[tuple[int, int]],
    held: bool,
) -> None:
    for first in range(0, len(chunks), CHUNK_BATCH):
        session.execute(
            insert(Chunk),
            [
                {
                    "job_id": job_id,
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


def first_stage(lane: str) -> str:
    """cpu chunks run in one task; gpu chunks start with pre-processing on a cpu worker."""
    return "run" if lane == "cpu" else "prep"


class ChunkRef(NamedTuple):
    """What sending a chunk needs: a few bytes per chunk, not an ORM object."""

    id: int
    task_id: str
    stage: str
