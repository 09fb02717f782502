"""Periodic maintenance scheduled by beat."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from celery import shared_task
from sqlalchemy import exists, select

from db.models import FINAL_JOB_STATUSES, Chunk, Job, Result
from db.queries import chunk_items, finalize_job, upsert_results, utcnow
from db.session import session_scope
from laneway.settings import get_settings
from tasks.backend import fire_and_forget
from tasks.base import LanewayTask, visibility_timeout

# A chunk that has been given this many workers without finishing fails its open items
# instead of going round again (a poison chunk must not loop forever).
MAX_CHUNK_ATTEMPTS = 3


def redispatch_stalled_chunks() -> dict[str, list[int]]:
    """Send again the chunks that claim to be running but cannot still be.

    A chunk running longer than the broker's visibility timeout outlived its hard time
    limit and any redelivery: its worker died, or its task failed outside the model stage.
    It gets a new task id and goes back to its lane; after MAX_CHUNK_ATTEMPTS its items
    without a result fail instead. Rows are locked with SKIP LOCKED, so a second beat
    never handles the same chunk.
    """
    from tasks.dispatch import chunk_signature

    settings = get_settings()
    deadline = utcnow() - timedelta(seconds=visibility_timeout(settings.chunk_timeout))
    resend: list[tuple[Chunk, str]] = []
    failed: list[int] = []
    with session_scope() as session:
        stalled = session.scalars(
            select(Chunk)
            .where(Chunk.state == "running", Chunk.started_at < deadline)
            .with_for_update(skip_locked=True)
        ).all()
        for chunk in stalled:
            job = session.get(Job, chunk.job_id)
            if job is None or job.status in FINAL_JOB_STATUSES:
                continue
            if chunk.attempts >= MAX_CHUNK_ATTEMPTS:
                done = set(session.scalars(select(Result.idx).where(Result.job_id == job.id)).all())
                error = f"chunk gave up after {chunk.attempts} attempts without finishing"
                upsert_results(
                    session,
                    job.id,
                    [
                        {
                            "idx": i,
                            "item_id": item_id,
                            "label": None,
                            "output": None,
                            "error": error,
                        }
                        for i, item_id, _ in chunk_items(session, chunk)
                        if i not in done
                    ],
                )
                chunk.state, chunk.finished_at = "failed", utcnow()
                failed.append(chunk.id)
                continue
            chunk.state, chunk.worker, chunk.started_at = "queued", None, None
            chunk.task_id = str(uuid.uuid4())
            resend.append((chunk, job.lane))
    # Sent after the commit, as every dispatch is.
    with fire_and_forget():
        for chunk, lane in resend:
            chunk_signature(chunk, lane, settings.chunk_timeout).apply_async()
    return {"redispatched": [c.id for c, _ in resend], "failed": failed}


def finalize_orphaned_jobs() -> list[str]:
    """Finalize jobs whose chunks have all ended but whose chord callback never ran.

    Safe beside live workers and a second beat: finalization is a conditional update, so a
    job is finalized once whoever gets there first.
    """
    open_chunk = exists().where(Chunk.job_id == Job.id, Chunk.state.in_(("queued", "running")))
    with session_scope() as session:
        ids = session.scalars(
            select(Job.id).where(Job.status.not_in(FINAL_JOB_STATUSES), ~open_chunk)
        ).all()
    finalized = []
    settings = get_settings()
    for job_id in ids:
        with session_scope() as session:
            if finalize_job(session, job_id, settings.cpu_price, settings.gpu_price):
                finalized.append(str(job_id))
    return finalized


@shared_task(name="laneway.reconcile", base=LanewayTask)
def reconcile() -> dict[str, Any]:
    chunks = redispatch_stalled_chunks()
    return {**chunks, "finalized": finalize_orphaned_jobs()}
