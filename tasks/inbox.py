"""The nightly batch path: the inbox scan beat schedules, the outbox writer that follows an
inbox job's finalization, and the webhook notice after it."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from celery import shared_task

from core.queueing.celery_app import TRANSIENT_ERRORS, LanewayTask, app_settings
from core.queueing.result_backend import fire_and_forget
from core.util.safefs import Refused
from core.util.webhooks import WebhookError
from jobs.inbox import scan_inbox
from jobs.outbox import notify_webhook, write_outbox

log = logging.getLogger("jobs.outbox")


@shared_task(name="laneway.scan_inbox", base=LanewayTask)
def scan_inbox_task() -> dict[str, Any]:
    outcomes = scan_inbox(app_settings())
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    return {"counts": counts, "files": [o.as_dict() for o in outcomes]}


@shared_task(name="laneway.write_outbox", base=LanewayTask)
def write_outbox_task(job_id: str) -> dict[str, Any]:
    try:
        written = write_outbox(uuid.UUID(job_id), app_settings())
    except Refused as exc:
        # The account's outbox folder is a link (or no folder): nothing is written through
        # it. The reconciler sends this writer again; it writes once the folder is real.
        log.error("job %s: outbox not written: %s", job_id, exc)
        return {"job": job_id, "written": False, "refused": str(exc)}
    if written is None:
        return {"job": job_id, "written": False}
    with fire_and_forget():
        notify_webhook_task.delay(job_id)
    return {**written, "written": True}


class WebhookTask(LanewayTask):
    """A webhook that is down or answers an error is asked again: 2, 4, 8 ... s, at most
    ten minutes apart, ten times."""

    autoretry_for = (*TRANSIENT_ERRORS, WebhookError)
    max_retries = 10
    retry_backoff = 2
    retry_backoff_max = 600


@shared_task(name="laneway.notify_webhook", base=WebhookTask)
def notify_webhook_task(job_id: str) -> dict[str, Any]:
    # The URL is neither an argument nor in the result: both are logged.
    return {"job": job_id, "told": notify_webhook(uuid.UUID(job_id), app_settings())}
