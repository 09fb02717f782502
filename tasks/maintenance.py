"""Periodic maintenance scheduled by beat."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from sqlalchemy import exists, select

from db.models import FINAL_JOB_STATUSES, Chunk, Job
from db.queries import finalize_job
from db.session import session_scope
from laneway.settings import get_settings
from tasks.base import LanewayTask


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
    return {"finalized": finalize_orphaned_jobs()}
