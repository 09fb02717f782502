"""`GET /v1/jobs`: the caller's jobs, newest first, with an opaque cursor and a status filter.

The cursor is the last shown job's (created_at, id), base64url-encoded JSON: opaque to
callers (they pass back `next_cursor` as given) and checked when it comes back, so a
mangled one is a 400 naming it rather than a 500.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from datetime import datetime
from typing import Any

from db.joblist import list_jobs
from db.models import JOB_STATUSES, Job
from db.session import session_factory
from jobs.inputs import InputError
from jobs.results import iso

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def encode_cursor(job: Job) -> str:
    raw = json.dumps([iso(job.created_at), str(job.id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The position a cursor names; InputError for anything this API did not hand out."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, job_id = json.loads(raw)
        return datetime.fromisoformat(created), uuid.UUID(job_id)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError, RecursionError):
        raise InputError(
            "'cursor' is not a cursor this API handed out: pass back next_cursor as given"
        ) from None


def parse_limit(value: str | None) -> int:
    if value is None:
        return DEFAULT_LIMIT
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise InputError(f"'limit' must be a whole number from 1 to {MAX_LIMIT}, not {value!r}")
    return limit


def parse_statuses(value: str | None) -> list[str]:
    """A comma-separated list of job statuses; each checked."""
    if value is None:
        return []
    statuses = [s.strip() for s in value.split(",")]
    for status in statuses:
        if status not in JOB_STATUSES:
            raise InputError(
                f"'status' {status!r} is not a job status; use one of {', '.join(JOB_STATUSES)}"
            )
    return statuses


def job_summary(job: Job, link: str) -> dict[str, Any]:
    """What a list shows of a job: enough to pick one, without the per-job queries of
    its full view (GET /v1/jobs/{id})."""
    return {
        "id": str(job.id),
        "status": job.status,
        "lane": job.lane,
        "tasks": job.tasks,
        "source": job.source,
        "total_items": job.total_items,
        "created_at": iso(job.created_at),
        "finished_at": iso(job.finished_at),
        "links": {"self": link},
    }


def job_page(settings: Any, account_id: int, args: dict[str, str], link: Any) -> dict[str, Any]:
    """One page: `data` (job summaries) and `next_cursor` (None on the last page).
    `link(job_id)` is the job's URL."""
    limit = parse_limit(args.get("limit"))
    statuses = parse_statuses(args.get("status"))
    cursor = args.get("cursor")
    after = decode_cursor(cursor) if cursor else None
    with session_factory(settings)() as session:
        # One more than asked says whether another page follows.
        jobs = list_jobs(session, account_id, limit + 1, after, statuses)
    more = len(jobs) > limit
    jobs = jobs[:limit]
    return {
        "data": [job_summary(job, link(job.id)) for job in jobs],
        "next_cursor": encode_cursor(jobs[-1]) if more else None,
    }
