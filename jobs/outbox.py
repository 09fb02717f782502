"""The outbox: an inbox job's results and summary, written for the account to pick up.

`LANEWAY_OUTBOX_DIR/<account>/<file>-results.csv` (for a CSV input; `.jsonl` otherwise)
and `<file>-summary.json`, each written under a temporary dot-name and renamed into place,
results first: a summary's presence means its results are complete. The account's folder
is opened without following a link (core/util/safefs.py): nothing is written outside it.
Then the account's webhook, if it has one, is told.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, update

from core.config.settings import Settings
from core.queueing.celery_app import sending_app, visibility_timeout
from core.queueing.result_backend import fire_and_forget
from core.util import safefs
from core.util.webhooks import post_json
from db.common import utcnow
from db.models import FINAL_JOB_STATUSES, Account, InboxFile, Job
from db.results import failure_summary, iter_results
from db.session import after_commit, session_factory, session_scope
from jobs.inputs import file_kind
from jobs.results import csv_blocks, job_view, jsonl_lines

log = logging.getLogger("jobs.outbox")
logging.getLogger("httpcore").setLevel(logging.WARNING)
WEBHOOK_TIMEOUT = 10.0


def outbox_names(row: InboxFile) -> tuple[str, str]:
    """(results file, summary file) for an inbox file."""
    kind, _ = file_kind(row.name)
    return f"{row.stem}-results.{'csv' if kind == 'csv' else 'jsonl'}", f"{row.stem}-summary.json"


@contextmanager
def account_folder(settings: Settings, account: str) -> Iterator[int]:
    """The account's outbox folder, open: a real folder on the outbox's filesystem, made
    when missing; a link planted in its place is refused (safefs.Refused), never followed."""
    root = safefs.open_root(settings.outbox_dir)
    try:
        fd = safefs.open_dir(account, root, os.fstat(root).st_dev, create=True)
    except safefs.Refused as exc:
        raise safefs.Refused(f"outbox folder {account!r}: {exc}; nothing written") from None
    finally:
        os.close(root)
    try:
        yield fd
    finally:
        os.close(fd)


def _inbox_job(session: Any, job_id: uuid.UUID) -> tuple[InboxFile, Job, Account] | None:
    found = session.execute(
        select(InboxFile, Job, Account)
        .join(Job, Job.id == InboxFile.job_id)
        .join(Account, Account.id == InboxFile.account_id)
        .where(InboxFile.job_id == job_id)
    ).one_or_none()
    return tuple(found) if found is not None else None  # type: ignore[return-value]


def _counts(job: Job) -> dict[str, int]:
    return {"total": job.total_items, "succeeded": job.succeeded_items, "failed": job.failed_items}


def write_outbox(job_id: uuid.UUID, settings: Settings) -> dict[str, Any] | None:
    """Write the job's results and summary; None when it is no final inbox job."""
    factory = session_factory(settings)
    with factory() as session:
        found = _inbox_job(session, job_id)
        if found is None or found[1].status not in FINAL_JOB_STATUSES:
            return None
        row, job, account_row = found
        account = account_row.name
        view = job_view(session, job, settings)
        failures = failure_summary(session, job.id, job.total_items)
    results_name, summary_name = outbox_names(row)
    with account_folder(settings, account) as folder, factory() as session:
        results = iter_results(session, job.id)
        blocks = (
            csv_blocks(results, list(job.tasks), list(job.labels))
            if results_name.endswith(".csv")
            else jsonl_lines(results)
        )
        safefs.write_atomically(folder, results_name, blocks)
    summary = {
        "file": {
            "name": row.name,
            "sha256": row.sha256,
            "bytes": row.size,
            "received_at": view["timings"]["created_at"],
        },
        "account": account,
        "results": results_name,
        **view,
        "counts": _counts(job),
        "failures": failures,
    }
    with account_folder(settings, account) as folder:
        safefs.write_atomically(folder, summary_name, [json.dumps(summary, indent=2) + "\n"])
    with factory.begin() as session:
        session.get(InboxFile, row.id).outbox_written_at = utcnow()  # type: ignore[union-attr]
    log.info("job %s: results in %s/%s", job.id, account, results_name)
    return {"job": str(job.id), "results": results_name, "summary": summary_name}


def notify_webhook(job_id: uuid.UUID, settings: Settings) -> bool:
    """POST the job's outcome to its account's webhook; False when there is none to tell.
    Raises WebhookError when the webhook cannot be reached or does not answer 2xx."""
    factory = session_factory(settings)
    with factory() as session:
        found = _inbox_job(session, job_id)
        if found is None or not found[2].webhook_url or found[0].notified_at is not None:
            return False
        row, job, account = found
        url = account.webhook_url
    results_name, summary_name = outbox_names(row)
    notice = {
        "event": "job.finished",
        "job": str(job.id),
        "account": account.name,
        "status": job.status,
        "counts": _counts(job),
        "file": row.name,
        "results": results_name,
        "summary": summary_name,
    }
    post_json(url, notice, timeout=WEBHOOK_TIMEOUT)
    with factory.begin() as session:
        session.get(InboxFile, row.id).notified_at = utcnow()  # type: ignore[union-attr]
    log.info("job %s: webhook of account %s told", job.id, account.name)
    return True


# --- sending the outbox writer (`laneway.write_outbox`, tasks/inbox.py) -----------------

WRITE_OUTBOX = "laneway.write_outbox"


def send_outbox(job_ids: Iterable[str], settings: Settings) -> list[str]:
    """After finalized jobs have committed: send the outbox writer for those that came
    from the inbox, noting when, so the reconciler can tell a lost message."""
    keys = [uuid.UUID(str(j)) for j in job_ids]
    if not keys:
        return []
    with session_scope(settings) as session:
        sent = session.scalars(
            update(InboxFile)
            .where(InboxFile.job_id.in_(keys))
            .values(outbox_sent_at=utcnow())
            .returning(InboxFile.job_id)
        ).all()
        after_commit(session, lambda: _send_writers(sent))
    return [str(j) for j in sent]


def _send_writers(job_ids: Iterable[uuid.UUID]) -> None:
    celery = sending_app()
    with fire_and_forget():
        for job_id in job_ids:
            celery.send_task(WRITE_OUTBOX, args=(str(job_id),))


def resend_lost_outbox(settings: Settings) -> list[str]:
    """Send again the outbox writer of final inbox jobs whose files are still unwritten
    a visibility timeout after it was last sent (its message was lost with the broker)."""
    deadline = utcnow() - timedelta(seconds=visibility_timeout(settings.chunk_timeout))
    with session_scope(settings) as session:
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
    return send_outbox((str(j) for j in ids), settings)
