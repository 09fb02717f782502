"""The chord callback: totals, label counts and timings into the job, and its final status."""

from __future__ import annotations

import uuid
from typing import Any

from celery import shared_task

from db.queries import finalize_job
from db.session import session_scope
from laneway.settings import get_settings
from tasks.base import LanewayTask


@shared_task(name="laneway.aggregate_job", base=LanewayTask)
def aggregate_job(job_id: str) -> dict[str, Any]:
    with session_scope() as session:
        settings = get_settings()
        status = finalize_job(session, uuid.UUID(job_id), settings.cpu_price, settings.gpu_price)
    return {"job": job_id, "status": status, "finalized": status is not None}
