"""The chunk task: read a chunk's items, run the three stages, upsert results, mark it done."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from celery import shared_task

from db.models import Chunk, Job
from db.queries import chunk_items, mark_job_running, upsert_results, utcnow
from db.session import session_scope
from workers.model_host import get_pipeline

log = logging.getLogger(__name__)


@shared_task(name="laneway.run_chunk", bind=True, acks_late=True)
def run_chunk(self: Any, chunk_id: int) -> dict[str, Any]:
    """Process one chunk; safe to run twice (results are upserted, done chunks are skipped)."""
    with session_scope() as session:
        chunk = session.get(Chunk, chunk_id)
        if chunk is None:
            return {"chunk": chunk_id, "skipped": "missing"}
        if chunk.state in ("done", "failed", "cancelled"):
            return {"chunk": chunk_id, "skipped": chunk.state}
        job = session.get(Job, chunk.job_id)
        assert job is not None
        chunk.state = "running"
        chunk.attempts += 1
        chunk.worker = self.request.hostname
        chunk.started_at = utcnow()
        mark_job_running(session, job.id)
        job_id: uuid.UUID = job.id
        tasks, labels = list(job.tasks), list(job.labels)
        items = [(item.idx, item.item_id, item.text) for item in chunk_items(session, chunk)]

    pipeline = get_pipeline()
    started = time.perf_counter()
    try:
        outputs, times = pipeline.run([text for _, _, text in items], tasks, labels)
        error = None
    except Exception as exc:  # the model failed on this chunk: its items fail, the job goes on
        log.exception("chunk %s failed", chunk_id)
        outputs, error = [None] * len(items), f"{type(exc).__name__}: {exc}"
        times = None
    elapsed = time.perf_counter() - started

    rows = [
        {
            "idx": idx,
            "item_id": item_id,
            "label": out.get("label") if out else None,
            "output": out,
            "error": error,
        }
        for (idx, item_id, _), out in zip(items, outputs, strict=True)
    ]
    device = str(getattr(pipeline.resolve(tasks[0]), "device", "cpu")).split(":")[0]
    with session_scope() as session:
        upsert_results(session, job_id, rows)
        chunk = session.get(Chunk, chunk_id)
        assert chunk is not None
        chunk.state = "failed" if error else "done"
        chunk.device = device
        # A failed chunk's time still cost money: book it all to the model stage.
        chunk.pre_seconds = times.pre if times else 0.0
        chunk.model_seconds = times.model if times else elapsed
        chunk.post_seconds = times.post if times else 0.0
        chunk.finished_at = utcnow()
    return {"chunk": chunk_id, "items": len(rows), "failed": len(rows) if error else 0}
