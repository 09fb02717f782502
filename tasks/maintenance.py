"""The reconciler, run by beat every LANEWAY_RECONCILE_INTERVAL seconds.

Postgres says what should be happening; the broker and the worker heartbeats say what is.
Where they disagree, Postgres wins: a chunk whose message was lost is sent again, a chunk
whose worker died goes back to its lane, a job whose last chunk's settle never ran is
finalized, and each lane's free slots go to waiting chunks (a refill nobody lived to
make). Safe beside live workers and a second beat: chunk rows are taken with FOR UPDATE
SKIP LOCKED, finalization is a conditional update, refills of a lane take turns.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import shared_task
from sqlalchemy import exists, select, update

from core.config.settings import Settings
from core.queueing.alerts import raise_alert
from core.queueing.broker import broker_snapshot, depths
from core.queueing.celery_app import QUEUES, LanewayTask, app_settings
from core.queueing.dispatch import chunk_messages, forget_unsent, send_chunks, unsent_chunks
from core.store.fleet_metrics import mark
from core.vocab import LANES
from db import idempotency
from db.common import UNSETTLED_CHUNK_STATES, aware, utcnow
from db.models import Chunk, Job, Worker
from db.session import after_commit, session_scope
from jobs import chunks, fairshare
from jobs.lanes import alive_workers
from jobs.lifecycle import settle
from jobs.outbox import resend_lost_outbox
from workers.registry import HEARTBEAT_LOST

log = logging.getLogger(__name__)
# Seconds past a chunk's hard time limit before it can no longer be running.
LIMIT_GRACE = 30


def live_workers(settings: Settings) -> set[str]:
    """Worker instances that beat within `worker_dead_after` seconds and did not stop."""
    return {worker.id for worker in alive_workers(settings)}


def mark_dead_workers(settings: Settings) -> list[str]:
    """Record the end of workers that stopped beating without a warm shutdown."""
    since = utcnow() - timedelta(seconds=settings.worker_dead_after)
    with session_scope(settings) as session:
        dead = list(
            session.scalars(
                select(Worker.id)
                .where(Worker.stopped_at.is_(None), Worker.last_seen_at < since)
                .with_for_update(skip_locked=True)
            )
        )
        if dead:
            session.execute(
                update(Worker)
                .where(Worker.id.in_(dead))
                .values(stopped_at=Worker.last_seen_at, stop_reason=HEARTBEAT_LOST)
            )
    return dead


def recover_chunks(
    settings: Settings | None = None, emptied_at: datetime | None = None
) -> dict[str, list[int]]:
    """Send again the chunks that are not where Postgres says they are.

    - `queued` and noted as unsent (core/queueing/dispatch.py: its send failed after its
      commit, the broker away): sent again on this pass, whatever the broker holds.
    - `queued` for longer than `redispatch_after` with no message in the broker (waiting,
      or delivered recently enough to be held by a live worker): the message was lost. When
      beat saw Redis come back empty at `emptied_at`, every chunk queued before then with
      no message is lost, however recently it was queued: no grace to wait out.
    - `running` on a worker instance that stopped beating: the worker died with it.
    - `running` on a live worker past its hard time limit with no message left: its task
      ended without recording an outcome.
    A chunk that has been started too often is split; a chunk of a job being cancelled is
    cancelled instead. Each of these is a transition of jobs/chunks.py, which locks the
    candidates `SKIP LOCKED` so that the reconciler never waits for a worker.

    On RabbitMQ (durable quorum queues, publisher confirms) a confirmed publish is not
    lost, and a worker's unacknowledged messages go back to their queue the moment its
    connection drops; what is left to lose is a send that failed after its commit (the
    broker away: noted as unsent, so sent again on the first pass after the broker is
    back) and a message dropped at the queue's delivery limit. AMQP lists no
    message without consuming it, so a queued chunk counts as lost when its stage's queue
    holds no ready message at all (nothing waits that could be it) and it has waited past
    `redispatch_after` plus the longest countdown (LanewayTask.retry_backoff_max: a retried
    task waits out its countdown in Celery's delay queues, not in the lane's). A lost
    message is found once its queue drains, later than on Redis but never missed. A chunk
    sent twice is harmless, as on Redis: a later claim takes the chunk over, only the
    claim's holder records its end, and results are upserted.
    """
    settings = settings or app_settings()
    now = utcnow()
    alive = live_workers(settings)
    outcome: dict[str, list[int]] = {"redispatched": [], "split": [], "cancelled": []}
    to_send: list[tuple[Chunk, str]] = []
    settle_jobs: set[uuid.UUID] = set()
    queued_before = now - timedelta(seconds=settings.redispatch_after)
    if settings.broker_is_rabbitmq:
        # Redis coming back empty loses none of RabbitMQ's messages: no prompt resend.
        queued_before -= timedelta(seconds=LanewayTask.retry_backoff_max)
    elif emptied_at is not None:
        queued_before = max(queued_before, min(emptied_at, now))
    unsent = unsent_chunks(settings)
    with session_scope(settings) as session:
        candidates = chunks.lock_recoverable(session, queued_before, unsent)
        # Read after the rows are locked: a worker claiming one of them now waits for us.
        broker = broker_snapshot(settings, QUEUES) if candidates else None
        for chunk, lane, status in candidates:
            messages = chunk_messages(chunk.task_id, lane)
            limit = settings.chunk_timeout_for(lane) + LIMIT_GRACE
            held_since = now.timestamp() - limit
            if chunk.state == "queued" and chunk.id in unsent:
                reason = "its send failed (the broker was away)"
            elif chunk.state == "queued":
                if any(broker.holds(i, held_since, queue) for i, queue in messages):
                    continue
                reason = "its broker message was lost"
            elif chunk.worker_instance in alive:
                if aware(chunk.started_at) > now - timedelta(seconds=limit):
                    continue
                if any(broker.holds(i, queue=queue) for i, queue in messages):
                    continue
                reason = "it outlived its time limit"
            else:
                reason = "its worker stopped beating"
            if status == "cancelling":
                chunks.cancel_locked(chunk, now)
                outcome["cancelled"].append(chunk.id)
                settle_jobs.add(chunk.job_id)
                continue
            log.warning("chunk %s (%s, %s): %s", chunk.id, chunk.state, chunk.stage, reason)
            if chunk.state == "running" and chunk.attempts >= chunks.attempt_limit(settings):
                reason = f"{reason}, {chunk.attempts} times"
                to_send.extend(chunks.exhaust(session, chunk, reason, event=True))
                outcome["split"].append(chunk.id)
                settle_jobs.add(chunk.job_id)
                continue
            chunks.redispatch(session, chunk, reason, now)
            to_send.append((chunk, lane))
            outcome["redispatched"].append(chunk.id)
        after_commit(session, lambda: send_chunks(to_send))
    # Each is sent again now, or waits for no send any more (it ended, or a worker is
    # claiming it: a claim comes from a message). Had this pass's send failed, it would
    # have noted its chunks afresh and not come here.
    forget_unsent(settings, sorted(unsent))
    for job_id in settle_jobs:
        settle(job_id, settings)
    return outcome


def finalize_orphaned_jobs(settings: Settings | None = None) -> list[str]:
    """Finalize jobs whose chunks have all ended but which nobody finalized (the worker
    of their last chunk died between its commit and its settle)."""
    settings = settings or app_settings()
    unsettled = exists().where(Chunk.job_id == Job.id, Chunk.state.in_(UNSETTLED_CHUNK_STATES))
    with session_scope(settings) as session:
        ids = session.scalars(
            select(Job.id).where(Job.status.in_(("queued", "running", "cancelling")), ~unsettled)
        ).all()
    return [str(job_id) for job_id in ids if settle(job_id, settings)]


def depth_alerts(settings: Settings | None = None) -> dict[str, int]:
    """Each lane's depth; alert for those above LANEWAY_ALERT_DEPTH."""
    settings = settings or app_settings()
    found = {lane: queue["depth"] for lane, queue in depths(settings, LANES).items()}
    for lane, depth in found.items():
        if depth > settings.alert_depth:
            raise_alert(
                f"depth:{lane}",
                f"Laneway: the {lane} lane holds {depth} tasks (queued + reserved + running), "
                f"above the alert threshold of {settings.alert_depth}",
                settings,
            )
    return found


@shared_task(name="laneway.reconcile", base=LanewayTask)
def reconcile(emptied_at: float | None = None) -> dict[str, Any]:
    """One pass; `emptied_at` (a Unix time) when beat sent it because Redis came back empty."""
    settings = app_settings()
    dead = mark_dead_workers(settings)
    emptied = None if emptied_at is None else datetime.fromtimestamp(emptied_at, UTC)
    chunks = recover_chunks(settings, emptied)
    outcome = {
        **chunks,
        "dead_workers": dead,
        "finalized": finalize_orphaned_jobs(settings),
        "released": fairshare.refill_all(settings),
        "depth": depth_alerts(settings),
        "outbox": resend_lost_outbox(settings),
    }
    with session_scope(settings) as session:
        idempotency.sweep(session)  # keys past their day answer nothing any more
    mark("reconcile", settings)  # a whole pass: the stalled-reconciler alert reads it
    return outcome
