"""Send a job's work: a chord of chunk tasks on the lane's queue, then the aggregate callback."""

from __future__ import annotations

from collections.abc import Sequence

from celery import chord

from db.models import Chunk
from tasks.aggregate import aggregate_job
from tasks.backend import fire_and_forget
from tasks.chunks import run_chunk


def dispatch_job(job_id: str, lane: str, chunks: Sequence[Chunk]) -> None:
    """Call only after the job's rows have committed: workers read them at once."""
    header = [run_chunk.si(c.id).set(queue=lane, task_id=c.task_id) for c in chunks]
    with fire_and_forget():  # nobody here waits on the result backend: Postgres is the truth
        chord(header)(aggregate_job.si(job_id).set(queue="cpu"))
