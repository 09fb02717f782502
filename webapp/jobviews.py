"""What the JSON API and the web pages both show of jobs: the caller's job or 404, its
results as a download, its dead letters, a retry, the job list, and the dashboard's
fleet-wide figures. One place for each query, so the two faces never disagree."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import redis
from flask import Response, abort, g
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.config.settings import Settings
from core.queueing.celery_app import INTERACTIVE_QUEUES
from core.store import usage
from core.util import pricing
from core.vocab import LANES
from db.common import alive_workers, aware, own_job, utcnow
from db.models import FINAL_JOB_STATUSES, Chunk, DeadLetter, Job, JobItem, Result, Worker
from db.results import iter_results, stage_seconds
from db.session import session_factory
from jobs import fairshare
from jobs.inputs import Limits
from jobs.lifecycle import retry_dead_letters
from jobs.results import csv_blocks, iso, jsonl_lines


def item_limits(settings: Settings, account_type: str) -> Limits:
    """The item limits of the caller's account type; its body limit bounds a gzip upload's
    inflated content too."""
    return Limits(
        settings.limits_for(account_type).max_items,
        settings.max_text_chars,
        f"LANEWAY_MAX_ITEMS_{account_type.upper()}",
        max_bytes=settings.limits_for(account_type).max_upload_bytes,
        max_bytes_setting=f"LANEWAY_MAX_UPLOAD_BYTES_{account_type.upper()}",
        max_blank_lines=settings.max_blank_lines,
    )


def own_job_or_404(session: Session, job_id: str) -> Job:
    """The signed-in account's job, or 404 (another account's job is indistinguishable
    from none)."""
    try:
        key = uuid.UUID(job_id)
    except ValueError:
        abort(404, description=f"no job {job_id!r}")
    job = own_job(session, g.account.id, key)
    if job is None:
        abort(404, description=f"no job {job_id!r}")
    return job


def results_download(
    settings: Settings, job_id: str, fmt: str, only: str | None = None
) -> Response:
    """The job's results (with only=failed, its failed items') streamed as JSONL or CSV,
    read a page at a time."""
    if fmt not in ("jsonl", "csv"):
        abort(400, description=f"unknown format {fmt!r}; use jsonl or csv")
    if only not in (None, "failed"):
        abort(400, description=f"unknown filter only={only!r}; use only=failed or leave it out")
    factory = session_factory(settings)
    with factory() as session:
        job = own_job_or_404(session, job_id)
        key, tasks, labels = job.id, list(job.tasks), list(job.labels)

    def lines() -> Iterator[str]:
        with factory() as session:
            results = iter_results(session, key, failed_only=only == "failed")
            if fmt == "csv":
                yield from csv_blocks(results, tasks, labels)
            else:
                yield from jsonl_lines(results)

    mimetype = "text/csv" if fmt == "csv" else "application/x-ndjson"
    name = "failed" if only == "failed" else "results"
    disposition = f'attachment; filename="{key}-{name}.{fmt}"'
    return Response(lines(), mimetype=mimetype, headers={"Content-Disposition": disposition})


def dead_letter_record(letter: DeadLetter) -> dict[str, Any]:
    return {
        "id": letter.id,
        "kind": letter.kind,
        "item_ids": letter.item_ids,
        "error": letter.error,
        "traceback": letter.traceback,
        "attempts": letter.attempts,
        "created_at": iso(letter.created_at),
        "retried_at": iso(letter.retried_at),
    }


def dead_letters(
    session: Session, job_id: uuid.UUID, limit: int | None = None
) -> list[dict[str, Any]]:
    """The job's dead letters, oldest first (the first `limit` of them)."""
    letters = session.scalars(
        select(DeadLetter).where(DeadLetter.job_id == job_id).order_by(DeadLetter.id).limit(limit)
    )
    return [dead_letter_record(x) for x in letters]


def open_letters(session: Session, job_id: uuid.UUID) -> int:
    """Dead letters not sent back yet (what the retry button would send)."""
    where = (DeadLetter.job_id == job_id, DeadLetter.retried_at.is_(None))
    return session.scalar(select(func.count()).where(*where)) or 0


class RetryRefused(Exception):
    """Nothing to send back, or the job cannot take it now (answered 409)."""


def retry_job(settings: Settings, job_id: uuid.UUID) -> tuple[int, int]:
    """Send the job's open dead letters back; (letters, items) sent, or RetryRefused."""
    retried = retry_dead_letters(job_id=job_id, settings=settings)
    if str(job_id) in retried.skipped:
        raise RetryRefused(f"cannot retry: {retried.skipped[str(job_id)]}")
    if not retried.letters:
        raise RetryRefused("the job has no dead letters to send back")
    return retried.letters, retried.jobs[str(job_id)]


# --- the pages' own views ---------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """One page of a listing: its rows, its number (from 1) and whether more follow."""

    rows: list[Any]
    number: int
    per_page: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.per_page))

    @property
    def has_prev(self) -> bool:
        return self.number > 1

    @property
    def has_next(self) -> bool:
        return self.number < self.pages


def page_number(raw: str | None) -> int:
    """A page number from the query string: a positive integer, else page 1."""
    return int(raw) if raw and raw.isdigit() and 0 < int(raw) < 10**9 else 1


def list_jobs(session: Session, account_id: int, number: int, per_page: int = 25) -> Page:
    """The account's jobs, newest first."""
    total = session.scalar(select(func.count()).where(Job.account_id == account_id)) or 0
    rows = session.scalars(
        select(Job)
        .where(Job.account_id == account_id)
        .order_by(Job.created_at.desc(), Job.id)
        .offset((number - 1) * per_page)
        .limit(per_page)
    ).all()
    return Page(list(rows), number, per_page, total)


def results_page(session: Session, job: Job, number: int, per_page: int = 50) -> Page:
    """The job's results in input order, a page at a time (by index: no deep OFFSET scan
    of other jobs' rows, the key is (job, idx))."""
    total = session.scalar(select(func.count()).where(Result.job_id == job.id)) or 0
    rows = session.scalars(
        select(Result)
        .where(Result.job_id == job.id)
        .order_by(Result.idx)
        .offset((number - 1) * per_page)
        .limit(per_page)
    ).all()
    return Page(list(rows), number, per_page, total)


# Characters of an item's text the job page shows beside its result: enough to judge the
# answer, and a page of 50 rows stays small whatever the texts' length.
SHOWN_CHARS = 200


def shorten(text: str, chars: int = SHOWN_CHARS) -> str:
    """`text` cut to at most `chars` characters, an ellipsis marking the cut."""
    return text if len(text) <= chars else text[: chars - 1].rstrip() + "\u2026"


def item_texts(
    session: Session, job_id: uuid.UUID, idxs: Sequence[int], chars: int = SHOWN_CHARS
) -> dict[int, str]:
    """The texts of the job's items `idxs` (their place in the input), shortened: the
    database sends no more than `chars` + 1 characters of each. job_items has no index by
    idx (JobItem says why), so this reads the job's rows: a page view costs a scan of the
    job's items, which grows with the job."""
    if not idxs:
        return {}
    rows = session.execute(
        select(JobItem.idx, func.substr(JobItem.text, 1, chars + 1)).where(
            JobItem.job_id == job_id, JobItem.idx.in_(sorted(set(idxs)))
        )
    )
    return {idx: shorten(text, chars) for idx, text in rows}


def failed_items(session: Session, job_id: uuid.UUID, limit: int = 50) -> tuple[list[Result], int]:
    """The job's first `limit` failed items, and how many failed in all."""
    failed = (Result.job_id == job_id, Result.error.is_not(None))
    total = session.scalar(select(func.count()).where(*failed)) or 0
    rows = session.scalars(select(Result).where(*failed).order_by(Result.idx).limit(limit))
    return list(rows), total


def progress(view: dict[str, Any], now_iso: str | None = None) -> dict[str, Any]:
    """The progress bar's figures from a job view: done, total, percent, an ETA from
    the pace so far (None until an item is done, or once the job has ended), and its
    place on the lane while chunks of it wait for a slot (the view's `queue`)."""
    done, total = view["progress"]["done"], view["progress"]["total"]
    final = view["status"] in FINAL_JOB_STATUSES
    eta = None
    started = view["timings"]["started_at"]
    if not final and started and 0 < done < total:
        now = datetime.fromisoformat(now_iso) if now_iso else utcnow()
        elapsed = (now - datetime.fromisoformat(started)).total_seconds()
        eta = round(max(0.0, elapsed / done * (total - done)), 1)
    return {
        "status": view["status"],
        "final": final,
        "done": done,
        "total": total,
        "percent": view["progress"]["percent"],
        "eta_seconds": eta,
        "queue": view.get("queue"),
    }


# --- the dashboard: the fleet, not an account ------------------------------------------

BUCKET_MINUTES = 5
HOUR_BUCKETS = 60 // BUCKET_MINUTES


def _chunk_items(start: int, stop: int, positions: list[int] | None) -> int:
    return len(positions) if positions is not None else stop - start


def _bucket(age_seconds: float) -> int | None:
    """The 5-minute bucket of the last hour (0 the oldest) that an age falls in."""
    bucket = HOUR_BUCKETS - 1 - int(age_seconds // (BUCKET_MINUTES * 60))
    return bucket if 0 <= bucket < HOUR_BUCKETS else None


def _dollars(
    settings: Settings, cpu_seconds: float, model_seconds: float, device: str, cores: float = 1.0
) -> float:
    """The pricing rule a job's cost applies (core/util/pricing.py), at the settings' prices."""
    return pricing.cost(
        cpu_seconds, model_seconds, device, settings.cpu_price, settings.gpu_price, cores
    )


def throughput(session: Session, now: datetime | None = None) -> dict[str, list[int]]:
    """Items finished per lane in each 5-minute bucket of the last hour, oldest first."""
    now = now or utcnow()
    since = now - timedelta(hours=1)
    series = {lane: [0] * HOUR_BUCKETS for lane in LANES}
    rows = session.execute(
        select(Chunk.queue, Chunk.finished_at, Chunk.start, Chunk.stop, Chunk.positions).where(
            Chunk.state == "done", Chunk.finished_at > since, Chunk.finished_at <= now
        )
    )
    for queue, finished, start, stop, positions in rows:
        bucket = _bucket((now - aware(finished)).total_seconds())
        if queue in series and bucket is not None:
            series[queue][bucket] += _chunk_items(start, stop, positions)
    return series


def cost_per_item(
    session: Session,
    settings: Settings,
    items: dict[str, list[int]],
    now: datetime | None = None,
) -> dict[str, float | None]:
    """Dollars per item by lane over the chunks done in the last hour (`items`: what
    throughput() counted): CPU stages at the CPU price, the model stage at its device's
    price (as a job's cost is reckoned)."""
    now = now or utcnow()
    since = now - timedelta(hours=1)
    columns, groups = stage_seconds(Chunk.queue)
    rows = session.execute(
        select(*columns)
        .where(Chunk.state == "done", Chunk.finished_at > since, Chunk.finished_at <= now)
        .group_by(*groups)
    ).all()
    dollars: dict[str, float] = defaultdict(float)
    for queue, device, cores, pre, model, post in rows:
        dollars[queue] += _dollars(settings, pre + post, model, device, cores)
    return _per_item(LANES, dollars, items)


def _per_item(
    lanes: Sequence[str], dollars: Mapping[str, float], items: Mapping[str, list[int]]
) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for lane in lanes:
        n = sum(items[lane])
        out[lane] = dollars.get(lane, 0.0) / n if n else None
    return out


def interactive_usage(
    r: redis.Redis, settings: Settings, now: datetime | None = None
) -> tuple[dict[str, list[int]], dict[str, float | None]]:
    """The interactive lanes' items per 5-minute bucket of the last hour and dollars per
    item, from the counters their workers keep per minute in Redis (core/store/usage.py):
    interactive requests are not stored in Postgres."""
    at = (now or utcnow()).timestamp()
    series = {lane: [0] * HOUR_BUCKETS for lane in INTERACTIVE_QUEUES}
    dollars: dict[str, float] = defaultdict(float)
    for lane, minutes in usage.last_hour(r, INTERACTIVE_QUEUES, at).items():
        for age, minute in minutes:  # all within the hour: each has its bucket
            series[lane][_bucket(age)] += minute.items
            dollars[lane] += _dollars(settings, minute.cpu_seconds, 0.0, "cpu")
            for device, seconds in minute.model_seconds.items():
                dollars[lane] += _dollars(settings, 0.0, seconds, device)
    return series, _per_item(INTERACTIVE_QUEUES, dollars, series)


def live_workers(session: Session, settings: Settings) -> list[dict[str, Any]]:
    """Worker processes heard from recently: queues, device, busy or idle and since when."""
    rows = alive_workers(session, settings.worker_dead_after)
    return [
        {
            "hostname": w.hostname,
            # Not the worker's own remote-control queue (name@host.dq2).
            "queues": ", ".join(q for q in w.queues if "@" not in q),
            "device": w.device or "?",
            "gpu_device": w.gpu_device,
            "busy": w.running_tasks > 0,
            "since": iso(_since(w)),
            "started_at": iso(w.started_at),
        }
        for w in rows
    ]


def _since(worker: Worker) -> Any:  # noqa: ANN401
    """Busy since its busy spell began; idle since its last task ended (or it started)."""
    if worker.running_tasks > 0:
        return worker.busy_since or worker.started_at
    return worker.idle_since or worker.started_at


def lane_shares(session: Session, settings: Settings) -> list[dict[str, Any]]:
    """Each lane's fair share as the dashboard and /metrics show it: its window, chunks in
    flight, and per account type (never per account: both are shown to every tenant or
    scraper) the type's share by weight, items in flight and items waiting for a slot."""
    shown = []
    for lane in LANES:
        board = fairshare.lane_board(session, settings, lane)
        types = {
            kind: {
                "share": row["share"],
                "in_flight_items": int(row["in_flight_items"]),
                "waiting_items": int(row["waiting_items"]),
            }
            for kind, row in sorted(board.by_type().items())
        }
        shown.append(
            {
                "lane": lane,
                "window": board.window,
                "in_flight_chunks": board.in_flight_chunks,
                "types": types,
            }
        )
    return shown
