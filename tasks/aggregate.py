"""The chord callback: totals, label counts and timings into the job, and its final status."""

from __future__ import annotations

import uuid
from typing import Any

from celery import shared_task

from core.obs import tracing
from core.queueing.celery_app import LanewayTask, app_settings
from jobs.lifecycle import settle


@shared_task(name="laneway.aggregate_job", base=LanewayTask)
def aggregate_job(job_id: str) -> dict[str, Any]:
    # Usually a no-op by now: the job's last chunk settles it as it finishes. The callback
    # still counts when that chunk's worker died between its commit and its settle.
    tracing.set_attributes(job=job_id)
    status = settle(uuid.UUID(job_id), app_settings())
    return {"job": job_id, "status": status, "finalized": status is not None}
