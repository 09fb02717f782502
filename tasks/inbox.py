"""The nightly batch path: the inbox scan beat schedules, the outbox writer that follows an
inbox job's finalization, and the webhook notice after it."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from celery import shared_task
from sqlalchemy import func, select, update

from db.models import FINAL_JOB_STATUSES, InboxFile, Job
from db.queries import utcnow
from db.session import after_commit, session_scope
from laneway.inbox import scan_inbox
from laneway.outbox import notify_webhook, write_outbox
from laneway.safefs import Refused
from laneway.settings import get_settings
from laneway.webhooks import WebhookError
from tasks.backend import fire_and_forget
from tasks.base import TRANSIENT_ERRORS, LanewayTask, visibility_timeout

log = logging.getLogger("laneway.outbox")


@shared_task(name="laneway.scan_inbox", base=LanewayTask)
def scan_inbox_task() -> dict[str, Any]:
    outcomes = scan_inbox()
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    return {"counts": counts, "files": [o.as_dict() for o in outcomes]}


@shared_task(name="laneway.write_outbox", base=LanewayTask)
def write_outbox_task(job_id: str) -> dict[str, Any]:
    try:
        written = write_outbox(uuid.UUID(job_id), get_settings())
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
    return {"job": job_id, "told": notify_webhook(uuid.UUID(job_id), get_settings())}


def send_outbox(job_ids: Iterable[str]) -> list[str]:
    """After finalized jobs have committed: send the outbox writer for those that came
    from the inbox, noting when, so the reconciler can tell a lost message."""
    keys = [uuid.UUID(str(j)) for j in job_ids]
    if not keys:
        return []
    with session_scope() as session:
        sent = session.scalars(
            update(InboxFile)
            .where(InboxFile.job_id.in_(keys))
            .values(outbox_sent_at=utcnow())
            .returning(InboxFile.job_id)
        ).all()
        after_commit(session, lambda: _send_writers(sent))
    return [str(j) for j in sent]


def _send_writers(job_ids: Iterable[uuid.UUID]) -> None:
    with fire_and_forget():
        for job_id in job_ids:
            write_outbox_task.delay(str(job_id))


def resend_lost_outbox() -> list[str]:
    """Send again the outbox writer of final inbox jobs whose files are still unwritten
    a visibility timeout after it was last sent (its message was lost with the broker)."""
    settings = get_settings()
    deadline = utcnow() - timedelta(seconds=visibility_timeout(settings.chunk_timeout))
    with session_scope() as session:
        ids = session.scalars(
            select(InboxFile.job_id)
            .join(Job, Job.id == InboxFile.job_id)
            .where(
                InboxFile.outbox_written_at.is_(None),
                Job.status.in_(FINAL_JOB_STATUSES),
                func.coalesce(InboxFile.outbox_sent_at, Job.finished_at) < deadline,
            )
            .with_for_update(skip_locked=True, of=InboxFile)
        ).all()
    return send_outbox(str(j) for j in ids)
