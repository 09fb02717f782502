"""A chunk's state machine: the one module that changes a chunk's row.

    held ──release──> queued ──claim──> running ──hand_on──> queued (next stage)
                        │                  │ ├──finish──> done | failed
                        │                  │ ├──requeue──> queued (a retry)
                        │                  │ └──exhaust──> split (+ two new queued halves)
                        └──────cancel──────┴──> cancelled       (recover: back to queued)

Callers (the chunk tasks, the reconciler, jobs/lifecycle.py, jobs/fairshare.py) decide
*when*; this module decides *how*, and every transition takes its row locks in one order:

0. A lane's fair-share lock (a Postgres advisory lock, jobs/fairshare.py) before any
   chunk, and only by a refill, in a transaction of its own: nothing waits for it while
   holding a row, and a release takes held chunks only `SKIP LOCKED`.
1. Dead letters, then the job (only `retry_dead_letters` holds letters).
2. A chunk's row, then its job's row. A transition on one chunk locks the chunk
   `FOR UPDATE` first (the reconciler `FOR UPDATE SKIP LOCKED`, so it never waits on a
   worker), then the job: `FOR KEY SHARE` to read it (a claim: starts of one job do not
   wait for each other, but do wait for a cancel holding the job, and then read it), and
   `FOR NO KEY UPDATE` to write the job's set of chunks (exhaust: new sequence numbers).
   Never `FOR UPDATE` after a chunk: two claims that each hold `KEY SHARE` on the job and
   both asked for `FOR UPDATE` would wait for each other; `NO KEY UPDATE` does not
   conflict with `KEY SHARE`, so such writers queue behind one another instead.
3. A job-level transition (cancel) locks the job `FOR UPDATE` first and then takes its
   chunks only `SKIP LOCKED`. It never waits for a chunk while holding the job: a chunk
   it skips is being claimed, released or recovered, and that holder (or the claim of a
   released one) reads the job's status after the cancel commits.
4. Results and dead letters are written while the chunk's row is held (their foreign
   keys take `KEY SHARE` on the job, so they wait for a cancel's commit, never the
   reverse). Settling a job (jobs/lifecycle.settle) runs in a transaction of its own
   after the chunk's commit and locks only the job's row.

Every transition is one transaction; a task it implies is sent after that commit.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from core.config.settings import Settings
from core.obs import metrics, tracing
from core.queueing.alerts import raise_alert
from core.queueing.dispatch import send_chunks
from core.util.isolate import Failure
from db.common import chunk_items, mark_job_running, record_event, utcnow
from db.intake import first_stage
from db.models import FINISHED_CHUNK_STATES, OPEN_CHUNK_STATES, Chunk, DeadLetter, Job
from db.results import upsert_results
from db.session import after_commit, session_scope

log = logging.getLogger(__name__)

# How a claim reads its job after locking the chunk (rule 2): FOR KEY SHARE.
JOB_LOCK_AT_START = {"read": True, "key_share": True}
# How a transition that adds chunks to a job locks it after a chunk (rule 2): FOR NO KEY
# UPDATE, which queues behind another such writer but not behind a claim's KEY SHARE.
JOB_LOCK_TO_SPLIT = {"key_share": True}

STAGE_ORDER = {"run": 0, "prep": 0, "model": 1, "post": 2}
# The stages that hold the lane's worker: each start counts as an attempt.
COUNTED_STAGES = ("run", "model")


def attempt_limit(settings: Settings) -> int:
    """Starts a chunk may have before it is split: its retries plus its deliveries."""
    return settings.max_chunk_attempts + settings.chunk_retries


@dataclass
class Work:
    """A claimed chunk: what its stage needs, read while the chunk was locked."""

    chunk_id: int
    job_id: uuid.UUID
    tasks: list[str]
    labels: list[str]
    items: list[tuple[int, str, str]]
    attempts: int
    lane: str
    account_id: int | None = None  # the job's: whose result cache entries it uses

    @property
    def texts(self) -> list[str]:
        return [text for _, _, text in self.items]


@dataclass
class Claim:
    """A claim's outcome: the work to run (None: nothing to do), and the job to settle
    when the claim ended the chunk (cancelled, or failed whole as it stood alone)."""

    work: Work | None
    settle: uuid.UUID | None = None
    lane: str = "cpu"


# --- claim and hand on ------------------------------------------------------------------


def claim(
    settings: Settings, chunk_id: int, stage: str, *, hostname: str | None, instance: str
) -> Claim:
    """Mark the chunk running on worker process `instance` for `stage`, and read its work.

    No work when there is nothing to do: the chunk is gone, finished, past this stage (a
    stale message), or its job is being cancelled (the chunk is cancelled). A chunk
    started too often (its workers keep dying on it) is split instead of run again.
    """
    with session_scope(settings) as session:
        chunk = session.get(Chunk, chunk_id, with_for_update=True)
        if chunk is None or chunk.state not in OPEN_CHUNK_STATES:
            return Claim(None)
        if STAGE_ORDER[chunk.stage] > STAGE_ORDER[stage]:
            return Claim(None)
        job = session.get(Job, chunk.job_id, with_for_update=JOB_LOCK_AT_START)
        assert job is not None
        counted = stage in COUNTED_STAGES
        if job.status in ("cancelling", "cancelled"):
            chunk.state, chunk.finished_at = "cancelled", utcnow()
            return Claim(None, job.id, chunk.queue)
        if counted and chunk.attempts >= attempt_limit(settings):
            halves = exhaust(
                session,
                chunk,
                f"the chunk was started {chunk.attempts} times without finishing "
                "(its worker died or hit the time limit each time)",
            )
            if halves:
                after_commit(session, lambda: send_chunks(halves))
            return Claim(None, None if halves else job.id, chunk.queue)
        chunk.state, chunk.stage = "running", stage
        chunk.worker_instance = instance
        chunk.started_at = utcnow()
        if counted:
            chunk.attempts += 1
            chunk.worker = hostname
        mark_job_running(session, job.id)
        items = [tuple(row) for row in chunk_items(session, chunk)]
        tracing.set_attributes(job=job.id, chunk=chunk.id, items=len(items), lane=chunk.queue)
        return Claim(
            Work(
                chunk.id,
                job.id,
                list(job.tasks),
                list(job.labels),
                items,
                chunk.attempts,
                chunk.queue,
                job.account_id,
            )
        )


def hand_on(
    settings: Settings, work: Work, next_stage: str, *, instance: str, **fields: Any
) -> None:
    """This stage is done: the chunk waits, queued, for `next_stage` on another worker.
    Only the claim's own holder hands it on (a recovered chunk is someone else's now)."""
    with session_scope(settings) as session:
        session.execute(
            update(Chunk)
            .where(
                Chunk.id == work.chunk_id,
                Chunk.state == "running",
                Chunk.worker_instance == instance,
            )
            .values(
                state="queued",
                stage=next_stage,
                worker_instance=None,
                queued_at=utcnow(),
                **fields,
            )
        )


# --- finish, cancel, requeue ------------------------------------------------------------


def finish(
    settings: Settings,
    work: Work,
    outputs: Sequence[dict[str, Any] | None],
    failures: Sequence[Failure | None] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Upsert the chunk's results, dead-letter its failed items, mark it done (or failed
    when every item failed). The caller settles the job afterwards."""
    failures = failures or [None] * len(work.items)
    rows = [
        {
            "idx": idx,
            "item_id": item_id,
            "label": out.get("label") if out and not failure else None,
            "output": out if not failure else None,
            "error": failure.error if failure else None,
        }
        for (idx, item_id, _), out, failure in zip(work.items, outputs, failures, strict=True)
    ]
    failed = [
        (idx, item_id, f) for (idx, item_id, _), f in zip(work.items, failures, strict=True) if f
    ]
    with session_scope(settings) as session:
        # Locked, then checked: a second copy of this chunk (a redelivery while the first
        # still ran) must not overwrite the results of a copy that already finished.
        chunk = session.get(Chunk, work.chunk_id, with_for_update=True)
        if chunk is None or chunk.state in FINISHED_CHUNK_STATES:
            return {"chunk": work.chunk_id, "skipped": True}
        upsert_results(session, work.job_id, rows)
        chunk.state = "failed" if failed and len(failed) == len(rows) else "done"
        chunk.last_error = failed[0][2].error[:2000] if failed else None
        chunk.finished_at = utcnow()
        for name, value in fields.items():
            setattr(chunk, name, value)
        letters = record_dead_letters(session, chunk, failed, len(rows), work.attempts)
    metrics.record_items(work.lane, len(rows), len(failed))
    if letters:
        raise_alert(
            "dead_letter",
            f"Laneway: {letters} dead letter(s) in job {work.job_id}; "
            f"first error: {failed[0][2].error[:300]}",
        )
    return {"chunk": work.chunk_id, "items": len(rows), "failed": len(failed)}


def cancel(settings: Settings, chunk_id: int) -> None:
    """The chunk stops where it is (its job is being cancelled); a finished one stays."""
    with session_scope(settings) as session:
        session.execute(
            update(Chunk)
            .where(Chunk.id == chunk_id, Chunk.state.in_(OPEN_CHUNK_STATES))
            .values(state="cancelled", finished_at=utcnow())
        )


def cancel_not_started(session: Session, job_id: uuid.UUID, now: datetime) -> None:
    """A cancel's chunk part, run while the cancel holds the job `FOR UPDATE` (rule 3):
    the held and queued chunks nobody holds now are cancelled; a locked one is skipped,
    and its holder (a claim, the reconciler) cancels it after reading the job's status."""
    not_started = (
        select(Chunk.id)
        .where(Chunk.job_id == job_id, Chunk.state.in_(("held", "queued")))
        .with_for_update(skip_locked=True)
    )
    session.execute(
        update(Chunk)
        .where(Chunk.id.in_(not_started.scalar_subquery()))
        .values(state="cancelled", finished_at=now)
    )


def requeue(settings: Settings, chunk_id: int) -> None:
    """The running chunk waits, queued, for its retry; one that ended meanwhile stays."""
    with session_scope(settings) as session:
        session.execute(
            update(Chunk)
            .where(Chunk.id == chunk_id, Chunk.state == "running")
            .values(state="queued", worker_instance=None, queued_at=utcnow())
        )


def release(session: Session, job_id: uuid.UUID, n: int, now: datetime) -> list[Any]:
    """The job's first `n` held chunks get a slot on their lane: queued, to be sent after
    the commit (rows of id, task id, stage, start, stop, positions, in order). Taken
    `SKIP LOCKED` under the lane's lock (rule 0): a chunk a cancel holds now is left to it.
    One statement: this runs at every chunk's end."""
    held = (
        select(Chunk.id)
        .where(Chunk.job_id == job_id, Chunk.state == "held")
        .order_by(Chunk.seq)
        .limit(n)
        .with_for_update(skip_locked=True)
    )
    rows = session.execute(
        update(Chunk)
        .where(Chunk.id.in_(held.scalar_subquery()))
        .values(state="queued", queued_at=now)
        .returning(
            Chunk.seq,
            Chunk.id,
            Chunk.task_id,
            Chunk.stage,
            Chunk.start,
            Chunk.stop,
            Chunk.positions,
        )  # fmt: skip
        .execution_options(synchronize_session=False)
    ).all()
    return sorted(rows, key=lambda row: row.seq)


# --- recovery by the reconciler -----------------------------------------------------------


def lock_recoverable(
    session: Session, queued_before: datetime, unsent: Collection[int] = ()
) -> list[Any]:
    """(chunk, lane, job status) of open jobs' chunks that may be lost: queued before
    `queued_before` or noted as `unsent`, or running. Locked `SKIP LOCKED` (rule 2): a
    chunk a worker is claiming or finishing now is not lost, and the reconciler never
    waits on one."""
    waited = Chunk.queued_at < queued_before
    if unsent:
        waited = or_(waited, Chunk.id.in_(sorted(unsent)))
    return list(
        session.execute(
            select(Chunk, Job.lane, Job.status)
            .join(Job, Job.id == Chunk.job_id)
            .where(
                Job.status.in_(("queued", "running", "cancelling")),
                or_(
                    and_(Chunk.state == "queued", waited),
                    Chunk.state == "running",
                ),
            )
            .order_by(Chunk.id)
            .with_for_update(of=Chunk, skip_locked=True)
        ).all()
    )


def cancel_locked(chunk: Chunk, now: datetime) -> None:
    """A locked chunk of a job being cancelled ends cancelled (not sent again)."""
    chunk.state, chunk.finished_at = "cancelled", now


def redispatch(session: Session, chunk: Chunk, reason: str, now: datetime) -> None:
    """A locked lost chunk goes back to its lane under a new task id (the caller sends it
    after the commit); a copy of the old message still running is no longer its holder."""
    record_event(session, chunk.job_id, "chunk_redispatched", {"chunk": chunk.id, "reason": reason})
    chunk.state, chunk.worker_instance, chunk.started_at = "queued", None, None
    chunk.task_id, chunk.queued_at, chunk.last_error = str(uuid.uuid4()), now, reason


# --- exhaustion: halves until the poison item stands alone ---------------------------------


def record_dead_letters(
    session: Session,
    chunk: Chunk,
    failed: Sequence[tuple[int, str, Failure]],
    n_items: int,
    attempts: int,
) -> int:
    """One letter for a chunk that failed whole, else one per failed item; returns how many."""
    if not failed:
        return 0
    if len(failed) == n_items and n_items > 1:
        groups = [list(failed)]
        kind = "chunk"
    else:
        groups = [[f] for f in failed]
        kind = "item"
    for group in groups:
        first = group[0][2]
        session.add(
            DeadLetter(
                job_id=chunk.job_id,
                chunk_id=chunk.id,
                kind=kind,
                idxs=[idx for idx, _, _ in group],
                item_ids=[item_id for _, item_id, _ in group],
                error=first.error[:2000],
                traceback=first.traceback[-20000:] if first.traceback else None,
                attempts=attempts,
            )
        )
    metrics.record_dead_letters(kind, len(groups))
    return len(groups)


def next_seq(session: Session, job_id: uuid.UUID) -> int:
    """The next free sequence number of the job's chunks; the caller holds the job."""
    return (session.scalar(select(func.max(Chunk.seq)).where(Chunk.job_id == job_id)) or 0) + 1


def new_chunk(
    job: Job, seq: int, start: int, stop: int, positions: list[int] | None, **kw: Any
) -> Chunk:
    """A chunk of the job at its lane's first stage: queued (a half, sent at once in its
    parent's place), or `state="held"` (a retry's chunk, which waits for a slot)."""
    return Chunk(
        job_id=job.id,
        seq=seq,
        start=start,
        stop=stop,
        positions=positions,
        queue=job.lane,
        task_id=str(uuid.uuid4()),
        stage=first_stage(job.lane),
        attempts=0,
        **{"state": "queued", **kw},
    )


def exhaust(
    session: Session, chunk: Chunk, reason: str, *, event: bool = False
) -> list[tuple[Chunk, str]]:
    """A locked chunk that keeps dying with its worker: split it in halves (returned, for
    the caller to send after the commit) until the item that kills workers stands alone; that one
    item fails, dead-lettered. With `event`, the job's history records the split.

    The job is locked `FOR NO KEY UPDATE` (rule 2), so two splitters of one job never
    pick the same new sequence numbers, and a claim's `KEY SHARE` never blocks it.
    """
    job = session.get(Job, chunk.job_id, with_for_update=JOB_LOCK_TO_SPLIT)
    assert job is not None
    items = chunk_items(session, chunk)
    now = utcnow()
    if len(items) <= 1:
        rows = [
            {"idx": idx, "item_id": item_id, "label": None, "output": None, "error": reason}
            for idx, item_id, _ in items
        ]
        upsert_results(session, job.id, rows)
        chunk.state, chunk.finished_at, chunk.last_error = "failed", now, reason
        failure = Failure(reason, "")
        record_dead_letters(
            session, chunk, [(i, d, failure) for i, d, _ in items], len(items), chunk.attempts
        )
        halves: list[tuple[Chunk, str]] = []
    else:
        half = len(items) // 2
        if chunk.positions is None:  # a range of positions: each position holds one item
            parts = [
                (chunk.start, chunk.start + half, None),
                (chunk.start + half, chunk.stop, None),
            ]
        else:
            positions = sorted(chunk.positions)
            parts = [
                (positions[0], positions[half - 1] + 1, positions[:half]),
                (positions[half], positions[-1] + 1, positions[half:]),
            ]
        seq = next_seq(session, job.id)
        children = [
            new_chunk(job, seq + n, start, stop, positions, parent_id=chunk.id)
            for n, (start, stop, positions) in enumerate(parts)
        ]
        session.add_all(children)
        chunk.state, chunk.finished_at, chunk.last_error = "split", now, reason
        session.flush()
        log.warning("chunk %s split in two after %s starts: %s", chunk.id, chunk.attempts, reason)
        halves = [(c, job.lane) for c in children]
    if event:
        record_event(session, chunk.job_id, "chunk_split", {"chunk": chunk.id})
    return halves
