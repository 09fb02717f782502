"""Send a job's work: a chord of chunk tasks on the lane's queue, then the aggregate callback."""

from __future__ import annotations

from collections.abc import Sequence

from celery import chain, chord

from db.models import Chunk
from laneway.settings import get_settings
from tasks.aggregate import aggregate_job
from tasks.backend import fire_and_forget
from tasks.base import chunk_time_limits
from tasks.chunks import model_chunk, post_chunk, prep_chunk, run_chunk


def chunk_signature(chunk: Chunk, lane: str, chunk_timeout: int):  # noqa: ANN201
    """The cpu lane runs a chunk in one task; the gpu lane keeps only the model stage on
    the gpu queue, with pre- and post-processing on cpu workers around it. Each task gets
    the chunk's soft and hard time limits."""
    limits = chunk_time_limits(chunk_timeout)
    if lane == "cpu":
        return run_chunk.si(chunk.id).set(queue="cpu", task_id=chunk.task_id, **limits)
    return chain(
        prep_chunk.si(chunk.id).set(queue="cpu", **limits),
        model_chunk.si(chunk.id).set(queue="gpu", task_id=chunk.task_id, **limits),
        post_chunk.si(chunk.id).set(queue="cpu", **limits),
    )


def dispatch_job(job_id: str, lane: str, chunks: Sequence[Chunk]) -> None:
    """Call only after the job's rows have committed: workers read them at once."""
    timeout = get_settings().chunk_timeout
    header = [chunk_signature(c, lane, timeout) for c in chunks]
    with fire_and_forget():  # nobody here waits on the result backend: Postgres is the truth
        chord(header)(aggregate_job.si(job_id).set(queue="cpu"))
