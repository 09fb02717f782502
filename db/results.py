"""A job's results: written by (job, item) so a redelivery never doubles one, read in
pages, summed into the job's totals and cost when it is finalized."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import exists, func, select, update
from sqlalchemy.orm import Session

from core.util import pricing, vectors
from core.util.jsoncodec import dumps
from db.common import UNSETTLED_CHUNK_STATES, record_event, utcnow
from db.models import FINAL_JOB_STATUSES, Chunk, Job, Result


def job_settled(session: Session, job_id: uuid.UUID) -> bool:
    """True when no chunk of the job is held, queued or running."""
    open_chunk = exists().where(Chunk.job_id == job_id, Chunk.state.in_(UNSETTLED_CHUNK_STATES))
    return not session.scalar(select(open_chunk))


COPY_RESULTS = (
    "COPY results (job_id, idx, item_id, label, output, vector, error) FROM STDIN (FORMAT BINARY)"
)
# Each column's binary form, in COPY_RESULTS' order. `output` goes as its JSON text, which is
# json's binary form too (Postgres' json_recv reads the text as json_in does).
COPY_TYPES = ("uuid", "int4", "text", "text", "text", "bytea", "text")


def upsert_results(session: Session, job_id: uuid.UUID, rows: Sequence[dict[str, Any]]) -> None:
    """Insert or overwrite results by (job, idx): a redelivered chunk never duplicates one.
    An output's vector is stored as float32 bytes in `vector` (core/util/vectors.py)."""
    if not rows:
        return
    split = vectors.split_many([row.get("output") for row in rows])
    postgres = session.connection().dialect.name == "postgresql"
    if postgres and copy_results(session, job_id, rows, split):
        return
    # New dicts: the outputs are shared (the result cache's store reads them).
    pairs = zip(rows, split, strict=True)
    rows = [{**row, "output": out, "vector": vec} for row, (out, vec) in pairs]
    _upsert_results(session, job_id, rows)


def copy_results(
    session: Session,
    job_id: uuid.UUID,
    rows: Sequence[dict[str, Any]],
    split: Sequence[tuple[dict[str, Any] | None, bytes | None]],
) -> bool:
    """The rows by one `COPY` when none of their items has a result yet (a chunk's first
    finish, nearly always), in a savepoint; False, nothing written, when one has (a retried
    dead letter, a redelivery): then only an upsert can overwrite it. `split`: each row's
    output without its vector, and the vector packed (vectors.split_many).

    `COPY` costs the worker less than a statement per row (SQLAlchemy's and psycopg's work
    per row and parameter). In binary form a vector travels as its float32 bytes, not as
    hex digits that the worker writes and Postgres parses back, work on both sides for
    every row of embeddings.
    """
    import psycopg

    nested = session.begin_nested()
    cursor = session.connection().connection.driver_connection.cursor()
    try:
        with cursor.copy(COPY_RESULTS) as copy:
            copy.set_types(COPY_TYPES)
            for row, (output, vector) in zip(rows, split, strict=True):
                # dumps(None): a failed item's output is JSON's null, as the ORM stores it.
                # A row may leave out what it has not (a label, an error), as for the upsert.
                copy.write_row(
                    (job_id, row["idx"], row["item_id"], row.get("label"),
                     dumps(output), vector, row.get("error"))
                )  # fmt: skip
    except psycopg.errors.UniqueViolation:
        nested.rollback()
        return False
    finally:
        cursor.close()
    nested.commit()
    return True


def _upsert_results(session: Session, job_id: uuid.UUID, rows: Sequence[dict[str, Any]]) -> None:
    """`INSERT ... ON CONFLICT DO UPDATE` of every row (SQLite, and Postgres' overwrites)."""
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
            "vector": stmt.excluded.vector,
            "error": stmt.excluded.error,
        },
    )
    # executemany: one cached statement, sent in batches (insertmanyvalues).
    session.execute(stmt, [{"job_id": job_id, **row} for row in rows])


def items_done(session: Session, job_id: uuid.UUID) -> int:
    return session.scalar(select(func.count()).where(Result.job_id == job_id)) or 0


def stage_seconds(*group: Any) -> tuple[list[Any], list[Any]]:
    """Columns and GROUP BY of a select of chunks per `group`, device and cores the worker
    held (Chunk.cpu_cores, 1 where none was recorded): `group`, the device, the cores, then
    the pre, model and post seconds."""
    stages = (Chunk.pre_seconds, Chunk.model_seconds, Chunk.post_seconds)
    columns = [
        *group,
        Chunk.device,
        func.coalesce(Chunk.cpu_cores, 1),
        *(func.coalesce(func.sum(stage), 0.0) for stage in stages),
    ]
    return columns, [*group, Chunk.device, Chunk.cpu_cores]


def job_cost(
    session: Session, job_id: uuid.UUID, total_items: int, cpu_price: float, gpu_price: float
) -> dict[str, Any]:
    """What the job's chunks cost so far: CPU stages at the CPU price, the model stage at
    the price of the device it ran on (GPU-seconds on CUDA, CPU-seconds otherwise), a CPU's
    seconds times the cores the worker held (core/util/pricing.py)."""
    columns, groups = stage_seconds()
    rows = session.execute(select(*columns).where(Chunk.job_id == job_id).group_by(*groups)).all()
    seconds = {"pre": 0.0, "model_cpu": 0.0, "model_gpu": 0.0, "post": 0.0}
    by_stage = {"pre": 0.0, "model": 0.0, "post": 0.0}
    for device, cores, pre, model, post in rows:
        seconds["pre"] += pre
        seconds["post"] += post
        seconds["model_gpu" if device == "cuda" else "model_cpu"] += model
        by_stage["pre"] += pricing.cost(pre, 0.0, device, cpu_price, gpu_price, cores)
        by_stage["model"] += pricing.cost(0.0, model, device, cpu_price, gpu_price, cores)
        by_stage["post"] += pricing.cost(post, 0.0, device, cpu_price, gpu_price, cores)
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
