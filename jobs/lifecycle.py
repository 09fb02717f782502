"""A job's life after submission: settling, cancelling, holding and releasing, dead letters.

Shared by the chunk tasks, the reconciler, the web app and the CLI. Every change is made
in one transaction, and any task it implies is sent only after that commit.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import redis
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from core.config.settings import Settings, get_settings
from core.obs import metrics
from core.queueing.alerts import raise_alert
from core.queueing.broker import lane_depth
from core.queueing.dispatch import dispatch_job
from core.store.redis_conn import redis_client
from core.util.isolate import Failure
from core.vocab import LANES
from db.common import aware, chunk_items, record_event, utcnow
from db.intake import first_stage
from db.models import (
    FINAL_JOB_STATUSES,
    Chunk,
    DeadLetter,
    Job,
    JobItem,
)
from db.results import finalize_job, upsert_results
from db.session import after_commit, session_scope
from jobs.outbox import send_outbox

log = logging.getLogger(__name__)
CANCEL_TTL = 7 * 24 * 3600


class JobStateError(RuntimeError):
    """The job cannot do that in its present state (the API answers 409)."""


class LaneFull(RuntimeError):
    """The lane is full and its hold is too: the API answers 503 with Retry-After."""

    def __init__(self, lane: str, retry_after: int) -> None:
        super().__init__(
            f"the {lane} lane is at capacity and its waiting room is full; "
            f"try again in {retry_after} s"
        )
        self.lane = lane
        self.retry_after = retry_after


def cancel_key(job_id: uuid.UUID | str) -> str:
    return f"laneway:cancel:{job_id}"


def attempt_limit(settings: Settings) -> int:
    """Starts a chunk may have before it is split: its retries plus its deliveries."""
    return settings.max_chunk_attempts + settings.chunk_retries


# --- finishing a job ---------------------------------------------------------------


def settle(job_id: uuid.UUID, settings: Settings | None = None) -> str | None:
    """Finalize the job if none of its chunks is left to run; then send an inbox job's
    outbox writer, alert on a failure and let held jobs into the capacity it freed.
    Returns the final status, once."""
    settings = settings or get_settings()
    with session_scope(settings) as session:
        status = finalize_job(session, job_id, settings.cpu_price, settings.gpu_price)
        if status is not None:
            lane, created, finished, cost = session.execute(
                select(Job.lane, Job.created_at, Job.finished_at, Job.cost).where(Job.id == job_id)
            ).one()
            # An inbox job's results go to the outbox.
            after_commit(session, lambda: send_outbox([str(job_id)], settings))
    if status is None:
        return None
    seconds = (aware(finished) - aware(created)).total_seconds() if finished else None
    metrics.record_job(lane, status, seconds, (cost or {}).get("total"))
    if status == "failed":
        raise_alert("job_failed", f"Laneway: job {job_id} failed: none of its items succeeded")
    release_held_jobs(settings)
    return status


# --- poison and crash isolation ----------------------------------------------------------


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


def dead_letter_alert(job_id: uuid.UUID, letters: int, error: str) -> None:
    raise_alert(
        "dead_letter",
        f"Laneway: {letters} dead letter(s) in job {job_id}; first error: {error[:300]}",
    )


def _next_seq(session: Session, job_id: uuid.UUID) -> int:
    return (session.scalar(select(func.max(Chunk.seq)).where(Chunk.job_id == job_id)) or 0) + 1


def _new_chunk(
    job: Job, seq: int, start: int, stop: int, positions: list[int] | None, **kw: Any
) -> Chunk:
    return Chunk(
        job_id=job.id,
        seq=seq,
        start=start,
        stop=stop,
        positions=positions,
        queue=job.lane,
        task_id=str(uuid.uuid4()),
        state="queued",
        stage=first_stage(job.lane),
        attempts=0,
        **kw,
    )


def exhaust_chunk(session: Session, chunk: Chunk, reason: str) -> list[tuple[Chunk, str]]:
    """A chunk that keeps dying with its worker: split it in halves (sent as new chunks)
    until the item that kills workers stands alone; that one item fails, dead-lettered.

    Returns the halves to send after the commit. The job row is locked first, so two
    splitters of one job never pick the same new sequence numbers.
    """
    job = session.get(Job, chunk.job_id, with_for_update=True)
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
        return []
    half = len(items) // 2
    if chunk.positions is None:  # a range of positions: each position holds one item
        parts = [(chunk.start, chunk.start + half, None), (chunk.start + half, chunk.stop, None)]
    else:
        positions = sorted(chunk.positions)
        parts = [
            (positions[0], positions[half - 1] + 1, positions[:half]),
            (positions[half], positions[-1] + 1, positions[half:]),
        ]
    seq = _next_seq(session, job.id)
    children = [
        _new_chunk(job, seq + n, start, stop, positions, parent_id=chunk.id)
        for n, (start, stop, positions) in enumerate(parts)
    ]
    session.add_all(children)
    chunk.state, chunk.finished_at, chunk.last_error = "split", now, reason
    session.flush()
    log.warning("chunk %s split in two after %s starts: %s", chunk.id, chunk.attempts, reason)
    return [(c, job.lane) for c in children]


# --- cancellation ----------------------------------------------------------------------


def cancel_job(job_id: uuid.UUID, settings: Settings | None = None) -> str:
    """Stop a job: chunks not started are cancelled now, running ones stop at their next
    micro-batch. Returns the job's status after the request (cancelling or cancelled)."""
    settings = settings or get_settings()
    with session_scope(settings) as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None:
            raise JobStateError("no such job")
        if job.status in FINAL_JOB_STATUSES:
            raise JobStateError(f"the job has already ended ({job.status})")
        if job.status != "cancelling":
            now = utcnow()
            job.status, job.cancel_requested_at = "cancelling", now
            # A chunk row locked now is being started (its worker holds it, then the job's:
            # the other order) or re-sent by the reconciler; waiting for it while holding
            # the job deadlocked the two. It is skipped, not lost: the start waits for this
            # commit and reads the cancel (tasks/chunks.py), a re-sent copy is cancelled
            # when claimed.
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
            record_event(session, job_id, "cancel_requested")
    try:
        redis_client(settings).set(cancel_key(job_id), 1, ex=CANCEL_TTL)
    except redis.RedisError:
        # The running chunks' stop check also reads the job's status in the database.
        log.warning("cancel flag for job %s not set in Redis", job_id)
    return settle(job_id, settings) or "cancelling"


# --- dead letters sent back --------------------------------------------------------------


@dataclass
class Retried:
    jobs: dict[str, int]  # job id -> items sent back
    letters: int
    skipped: dict[str, str]  # job id -> why its letters were not sent back


def retry_dead_letters(
    job_id: uuid.UUID | None = None,
    letter_ids: Sequence[int] | None = None,
    settings: Settings | None = None,
) -> Retried:
    """Send open dead letters back: their items form new chunks of the job, which runs
    again and is finalized anew. A letter is sent back once (locked, then marked)."""
    settings = settings or get_settings()
    query = select(DeadLetter).where(DeadLetter.retried_at.is_(None))
    if job_id is not None:
        query = query.where(DeadLetter.job_id == job_id)
    if letter_ids is not None:
        query = query.where(DeadLetter.id.in_(list(letter_ids)))
    result = Retried({}, 0, {})
    with session_scope(settings) as session:
        letters = session.scalars(
            query.order_by(DeadLetter.id).with_for_update(skip_locked=True)
        ).all()
        by_job: dict[uuid.UUID, list[DeadLetter]] = defaultdict(list)
        for letter in letters:
            by_job[letter.job_id].append(letter)
        for jid, group in by_job.items():
            job = session.get(Job, jid, with_for_update=True)
            assert job is not None
            if job.status in ("held", "cancelling", "cancelled"):
                result.skipped[str(jid)] = f"the job is {job.status}"
                continue
            wanted = {idx for letter in group for idx in letter.idxs}
            # Items are keyed by position: find the letters' items' positions once (a scan
            # of the job's items; sending letters back is rare), then chunks name those.
            ordered = session.execute(
                select(JobItem.idx, JobItem.pos)
                .where(JobItem.job_id == jid, JobItem.idx.in_(wanted))
                .order_by(JobItem.pos)
            ).all()
            seq = _next_seq(session, jid)
            chunks: list[Chunk] = []
            chunk_of: dict[int, Chunk] = {}
            for n, begin in enumerate(range(0, len(ordered), job.chunk_size)):
                part = ordered[begin : begin + job.chunk_size]
                chunk = _new_chunk(
                    job, seq + n, part[0].pos, part[-1].pos + 1, [p.pos for p in part]
                )
                chunks.append(chunk)
                chunk_of.update((p.idx, chunk) for p in part)
            session.add_all(chunks)
            session.flush()
            now = utcnow()
            for letter in group:
                letter.retried_at = now
                letter.retry_chunk_id = chunk_of[letter.idxs[0]].id
            if job.status in FINAL_JOB_STATUSES:
                job.status, job.finished_at = "running", None
            record_event(session, jid, "retried", {"letters": len(group), "items": len(ordered)})
            result.jobs[str(jid)] = len(ordered)
            result.letters += len(group)
            after_commit(session, partial(dispatch_job, str(jid), job.lane, chunks))
    return result


# --- backpressure --------------------------------------------------------------------------


def _held_items(session: Session, lane: str) -> int:
    return (
        session.scalar(
            select(func.coalesce(func.sum(Job.total_items), 0)).where(
                Job.status == "held", Job.lane == lane
            )
        )
        or 0
    )


def lane_is_full(settings: Settings, lane: str) -> bool:
    """True when the lane's depth (queued + reserved + running) has reached its limit.
    When Redis cannot say, the lane counts as open: the job is stored either way."""
    try:
        return lane_depth(redis_client(settings), lane)["depth"] >= settings.lane_limit(lane)
    except redis.RedisError:
        return False


def admit(session: Session, settings: Settings, lane: str, n_items: int) -> bool:
    """Whether a new job on `lane` must be held (True) or may be sent now (False).

    Jobs wait in arrival order: while any job is held on the lane, new ones are held too.
    Raises LaneFull when holding this one would pass `LANEWAY_HOLD_LIMIT` held items.
    """
    held = _held_items(session, lane)
    if not held and not lane_is_full(settings, lane):
        return False
    if held + n_items > settings.hold_limit:
        raise LaneFull(lane, retry_after(settings))
    return True


def retry_after(settings: Settings) -> int:
    """Seconds a refused client should wait: two reconciler rounds, which release held jobs."""
    return max(30, 2 * settings.reconcile_interval)


def release_held_jobs(settings: Settings | None = None) -> list[str]:
    """Send held jobs, oldest first, while their lane has room under its limit."""
    settings = settings or get_settings()
    released: list[str] = []
    r = redis_client(settings)
    for lane in LANES:
        limit = settings.lane_limit(lane)
        try:
            depth = lane_depth(r, lane)["depth"]
        except redis.RedisError:
            return []
        if depth >= limit:
            continue
        with session_scope(settings) as session:
            jobs = session.scalars(
                select(Job)
                .where(Job.status == "held", Job.lane == lane)
                .order_by(Job.created_at)
                .with_for_update(skip_locked=True)
            ).all()
            now = utcnow()
            for job in jobs:
                if depth >= limit:
                    break
                chunks = list(
                    session.scalars(
                        select(Chunk)
                        .where(Chunk.job_id == job.id, Chunk.state == "held")
                        .order_by(Chunk.seq)
                    )
                )
                for chunk in chunks:
                    chunk.state, chunk.queued_at = "queued", now
                job.status = "queued"
                record_event(session, job.id, "released", {"depth": depth})
                depth += len(chunks)
                released.append(str(job.id))
                after_commit(session, partial(dispatch_job, str(job.id), lane, chunks))
    return released
