"""Send a job's work: a chord of chunk tasks on the lane's queue, then the aggregate callback."""

from __future__ import annotations

from collections.abc import Sequence

from celery import chain, chord

from db.models import Chunk
from tasks.aggregate import aggregate_job
from tasks.backend import fire_and_forget
from tasks.chunks import model_chunk, post_chunk, prep_chunk, run_chunk


def chunk_signature(chunk: Chunk, lane: str):  # noqa: ANN201
    """The cpu lane runs a chunk in one task; the gpu lane keeps only the model stage on
    the gpu queue, with pre- and post-processing on cpu workers around it."""
    if lane == "cpu":
        return run_chunk.si(chunk.id).set(queue="cpu", task_id=chunk.task_id)
    return chain(
        prep_chunk.si(chunk.id).set(queue="cpu"),
        model_chunk.si(chunk.id).set(queue="gpu", task_id=chunk.task_id),
        post_chunk.si(chunk.id).set(queue="cpu"),
    )


def dispatch_job(job_id: str, lane: str, chunks: Sequence[Chunk]) -> None:
    """Call only after the job's rows have committed: workers read them at once."""
    header = [chunk_signature(c, lane) for c in chunks]
    with fire_and_forget():  # nobody here waits on the result backend: Postgres is the truth
        chord(header)(aggregate_job.si(job_id).set(queue="cpu"))
