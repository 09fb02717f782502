"""The chord callback of releases that sent a job's chunks as one chord: kept registered so
that such a message, still queued across an upgrade, settles its job rather than failing
as an unknown task. Jobs are now settled by their last chunk, or by the reconciler."""

from __future__ import annotations

import uuid
from typing import Any

from celery import shared_task

from core.obs import tracing
from core.queueing.celery_app import LanewayTask, app_settings
from jobs.lifecycle import settle


@shared_task(name="laneway.aggregate_job", base=LanewayTask)
def aggregate_job(job_id: str) -> dict[str, Any]:
    tracing.set_attributes(job=job_id)
    status = settle(uuid.UUID(job_id), app_settings())
    return {"job": job_id, "status": status, "finalized": status is not None}
