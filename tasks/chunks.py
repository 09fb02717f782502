"""Chunk tasks: read a chunk's items, run the three stages, upsert results, mark it done.

The cpu lane runs all three stages in one task (`run_chunk`). The gpu lane splits them so
that only the model stage occupies a device worker (measured in docs/benchmarks.md):
`prep_chunk` (cpu queue) -> `model_chunk` (gpu queue) -> `post_chunk` (cpu queue), handing
tokens and raw outputs over through Redis. Every task is safe to run twice: results are
upserted and finished chunks are skipped; a stage whose hand-off vanished (Redis emptied)
redoes the earlier stages itself.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from celery import shared_task

from db.models import Chunk, Job
from db.queries import chunk_items, mark_job_running, upsert_results, utcnow
from db.session import session_scope
from inference.pipeline import Staged
from laneway.redis_conn import redis_client
from laneway.settings import get_settings
from tasks.base import LanewayTask
from workers.devices import model_device
from workers.model_host import get_pipeline

log = logging.getLogger(__name__)
FINISHED = ("done", "failed", "cancelled")
HANDOFF_TTL = 6 * 3600  # seconds a stage's output waits in Redis for the next stage


@dataclass
class Work:
    chunk_id: int
    job_id: uuid.UUID
    tasks: list[str]
    labels: list[str]
    items: list[tuple[int, str, str]]

    @property
    def texts(self) -> list[str]:
        return [text for _, _, text in self.items]


def _load(chunk_id: int, claim_by: str | None = None) -> Work | None:
    """The chunk's work, or None when it is missing or finished. With claim_by, mark it
    running on that worker (the stage that occupies the lane's worker claims it)."""
    with session_scope() as session:
        chunk = session.get(Chunk, chunk_id)
        if chunk is None or chunk.state in FINISHED:
            return None
        job = session.get(Job, chunk.job_id)
        assert job is not None
        if claim_by is not None:
            chunk.state = "running"
            chunk.attempts += 1
            chunk.worker = claim_by
            chunk.started_at = utcnow()
            mark_job_running(session, job.id)
        items = [(i.idx, i.item_id, i.text) for i in chunk_items(session, chunk)]
        return Work(chunk.id, job.id, list(job.tasks), list(job.labels), items)


def _record(chunk_id: int, **fields: Any) -> None:
    with session_scope() as session:
        chunk = session.get(Chunk, chunk_id)
        if chunk is not None:
            for name, value in fields.items():
                setattr(chunk, name, value)


def _finish(work: Work, outputs: list[Any], error: str | None, **seconds: float) -> dict:
    """Upsert the chunk's results and mark it done (or failed) with its stage seconds."""
    rows = [
        {
            "idx": idx,
            "item_id": item_id,
            "label": out.get("label") if out else None,
            "output": out,
            "error": error,
        }
        for (idx, item_id, _), out in zip(work.items, outputs, strict=True)
    ]
    with session_scope() as session:
        # Locked, then checked: a second copy of this chunk (a redelivery while the first
        # still ran) must not overwrite the results of a copy that already finished.
        chunk = session.get(Chunk, work.chunk_id, with_for_update=True)
        if chunk is None or chunk.state in FINISHED:
            return {"chunk": work.chunk_id, "skipped": True}
        upsert_results(session, work.job_id, rows)
        chunk.state = "failed" if error else "done"
        chunk.finished_at = utcnow()
        for name, value in seconds.items():
            setattr(chunk, name, value)
    return {"chunk": work.chunk_id, "items": len(rows), "failed": len(rows) if error else 0}


def _failed(work: Work, exc: Exception, **seconds: float) -> dict:
    # The model failed on this chunk: its items fail with the error, the job goes on.
    log.exception("chunk %s failed", work.chunk_id)
    return _finish(work, [None] * len(work.items), f"{type(exc).__name__}: {exc}", **seconds)


@shared_task(name="laneway.run_chunk", bind=True, base=LanewayTask)
def run_chunk(self: Any, chunk_id: int) -> dict[str, Any]:
    """All three stages in one task (the cpu lane)."""
    work = _load(chunk_id, claim_by=self.request.hostname)
    if work is None:
        return {"chunk": chunk_id, "skipped": True}
    device = model_device(get_settings())
    started = time.perf_counter()
    try:
        outputs, times = get_pipeline().run(work.texts, work.tasks, work.labels)
    except Exception as exc:
        return _failed(work, exc, device=device, model_seconds=time.perf_counter() - started)
    return _finish(
        work,
        outputs,
        None,
        device=device,
        pre_seconds=times.pre,
        model_seconds=times.model,
        post_seconds=times.post,
    )


def _key(chunk_id: int, part: str) -> str:
    return f"laneway:chunk:{chunk_id}:{part}"


@shared_task(name="laneway.prep_chunk", base=LanewayTask)
def prep_chunk(chunk_id: int) -> dict[str, Any]:
    """gpu lane, stage 1 on a cpu worker: clean and tokenize, hand the tokens over."""
    work = _load(chunk_id)
    if work is None:
        return {"chunk": chunk_id, "skipped": True}
    started = time.perf_counter()
    staged = get_pipeline().pre(work.texts, work.tasks)
    blob = staged.to_bytes("prepared")
    redis_client(get_settings()).set(_key(chunk_id, "prepared"), blob, ex=HANDOFF_TTL)
    _record(chunk_id, pre_seconds=time.perf_counter() - started)
    return {"chunk": chunk_id, "prepared_bytes": len(blob)}


@shared_task(name="laneway.model_chunk", bind=True, base=LanewayTask)
def model_chunk(self: Any, chunk_id: int) -> dict[str, Any]:
    """gpu lane, stage 2 on a gpu worker: only the model stage runs here."""
    work = _load(chunk_id, claim_by=self.request.hostname)
    if work is None:
        return {"chunk": chunk_id, "skipped": True}
    settings = get_settings()
    pipeline, r = get_pipeline(), redis_client(settings)
    device = model_device(settings)
    blob = r.get(_key(chunk_id, "prepared"))
    if blob is None:  # the hand-off was lost (Redis emptied): tokenize here instead
        staged = pipeline.pre(work.texts, work.tasks)
    else:
        staged = Staged(work.tasks)
        staged.load("prepared", blob)
    started = time.perf_counter()
    try:
        pipeline.model(staged, work.labels)
    except Exception as exc:
        return _failed(work, exc, device=device, model_seconds=time.perf_counter() - started)
    model_seconds = time.perf_counter() - started
    r.set(_key(chunk_id, "raw"), staged.to_bytes("raw"), ex=HANDOFF_TTL)
    _record(chunk_id, device=device, model_seconds=model_seconds)
    return {"chunk": chunk_id, "model_seconds": model_seconds}


@shared_task(name="laneway.post_chunk", base=LanewayTask)
def post_chunk(chunk_id: int) -> dict[str, Any]:
    """gpu lane, stage 3 on a cpu worker: scores, entities, formatting, results."""
    work = _load(chunk_id)
    if work is None:
        return {"chunk": chunk_id, "skipped": True}
    pipeline, r = get_pipeline(), redis_client(get_settings())
    prepared, raw = r.get(_key(chunk_id, "prepared")), r.get(_key(chunk_id, "raw"))
    started = time.perf_counter()
    if prepared is None or raw is None:
        # A hand-off was lost: compute the chunk here rather than lose it.
        log.warning("chunk %s: stage hand-off missing, running every stage here", chunk_id)
        try:
            outputs, _ = pipeline.run(work.texts, work.tasks, work.labels)
        except Exception as exc:
            return _failed(work, exc)
    else:
        staged = Staged(work.tasks)
        staged.load("prepared", prepared)
        staged.load("raw", raw)
        outputs = pipeline.post(staged, work.texts, work.labels)
    result = _finish(work, outputs, None, post_seconds=time.perf_counter() - started)
    r.delete(_key(chunk_id, "prepared"), _key(chunk_id, "raw"))
    return result
