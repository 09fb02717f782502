"""The chunk task: read a chunk's items, run the model, upsert the results, mark it done."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from celery import shared_task

from db.models import Chunk, Job
from db.queries import chunk_items, mark_job_running, upsert_results, utcnow
from db.session import session_scope
from workers.model_host import get_classifier

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
        labels = list(job.labels)
        items = [(item.idx, item.item_id, item.text) for item in chunk_items(session, chunk)]

    texts = [text for _, _, text in items]
    started = time.perf_counter()
    try:
        outputs = get_classifier().classify(texts, labels)
        error = None
    except Exception as exc:  # the model failed on this chunk: its items fail, the job goes on
        log.exception("chunk %s failed in the model stage", chunk_id)
        outputs, error = [None] * len(items), f"{type(exc).__name__}: {exc}"
    model_seconds = time.perf_counter() - started

    rows = [
        {
            "idx": idx,
            "item_id": item_id,
            "label": out["label"] if out else None,
            "output": out,
            "error": error,
        }
        for (idx, item_id, _), out in zip(items, outputs, strict=True)
    ]
    with session_scope() as session:
        upsert_results(session, job_id, rows)
        chunk = session.get(Chunk, chunk_id)
        assert chunk is not None
        chunk.state = "failed" if error else "done"
        chunk.model_seconds = model_seconds
        chunk.finished_at = utcnow()
    return {"chunk": chunk_id, "items": len(rows), "failed": len(rows) if error else 0}
