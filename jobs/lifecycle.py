"""A job's life after submission: settling, cancelling, admission, dead letters sent back.

Shared by the chunk tasks, the reconciler, the web app and the CLI. Every change is made
in one transaction, and any task it implies is sent only after that commit. The job's
chunk rows change only through jobs/chunks.py, which states the order rows are locked in.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.config.settings import Settings, get_settings
from core.obs import metrics
from core.queueing.alerts import raise_alert
from core.store.redis_conn import redis_client
from db.common import aware, record_event, utcnow
from db.models import (
    FINAL_JOB_STATUSES,
    Chunk,
    DeadLetter,
    Job,
    JobItem,
)
from db.results import finalize_job
from db.session import after_commit, session_scope
from jobs import chunks, fairshare
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


# --- finishing a job ---------------------------------------------------------------


def settle(job_id: uuid.UUID, settings: Settings | None = None) -> str | None:
    """Finalize the job if none of its chunks is left to run; then send an inbox job's
    outbox writer and alert on a failure. Returns the final status, once."""
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
    return status


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
            chunks.cancel_not_started(session, job_id, now)
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
    """Send open dead letters back: their items form new chunks of the job, which wait
    for slots on its lane like any other; the job runs again and is finalized anew. A
    letter is sent back once (locked, then marked)."""
    settings = settings or get_settings()
    query = select(DeadLetter).where(DeadLetter.retried_at.is_(None))
    if job_id is not None:
        query = query.where(DeadLetter.job_id == job_id)
    if letter_ids is not None:
        query = query.where(DeadLetter.id.in_(list(letter_ids)))
    result = Retried({}, 0, {})
    lanes: set[str] = set()
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
            if job.status in ("cancelling", "cancelled"):
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
            seq = chunks.next_seq(session, jid)
            new: list[Chunk] = []
            chunk_of: dict[int, Chunk] = {}
            for n, begin in enumerate(range(0, len(ordered), job.chunk_size)):
                part = ordered[begin : begin + job.chunk_size]
                chunk = chunks.new_chunk(
                    job, seq + n, part[0].pos, part[-1].pos + 1, [p.pos for p in part], state="held"
                )
                new.append(chunk)
                chunk_of.update((p.idx, chunk) for p in part)
            session.add_all(new)
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
            lanes.add(job.lane)
    for lane in sorted(lanes):
        fairshare.safe_refill(settings, lane)
    return result


# --- backpressure --------------------------------------------------------------------------


def admit(session: Session, settings: Settings, lane: str, n_items: int) -> None:
    """A new job's items may wait on `lane`: every job waits in Postgres for its slots
    (jobs/fairshare.py), so only the lane's waiting room bounds it. Raises LaneFull when
    this job would pass `LANEWAY_HOLD_LIMIT` items waiting on the lane."""
    if fairshare.waiting_items(session, lane) + n_items > settings.hold_limit:
        raise LaneFull(lane, retry_after(settings))


def retry_after(settings: Settings) -> int:
    """Seconds a refused client should wait: two reconciler rounds."""
    return max(30, 2 * settings.reconcile_interval)
