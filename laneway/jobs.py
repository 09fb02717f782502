"""Submitting a job: route, chunk, write it to the database, commit, then dispatch."""

from __future__ import annotations

from collections.abc import Sequence

from db.models import Account, Job
from db.queries import chunks_of, create_job
from db.session import session_factory
from laneway.planner import choose_lane, plan_chunks
from laneway.settings import Settings, get_settings

TASKS = ("classify",)


def submit_job(
    account: Account,
    items: Sequence[tuple[str, str]],
    *,
    task: str = "classify",
    labels: Sequence[str] | None = None,
    source: str = "api",
    settings: Settings | None = None,
) -> Job:
    """Store the job and its items, then send its chord once the rows are committed."""
    from tasks.dispatch import dispatch_job

    settings = settings or get_settings()
    lane = choose_lane(account.type, len(items), settings.gpu_threshold)
    with session_factory(settings)() as session:
        job = create_job(
            session,
            account_id=account.id,
            task=task,
            labels=list(labels or settings.default_labels),
            items=items,
            lane=lane,
            chunks=plan_chunks(len(items), settings.chunk_size),
            chunk_size=settings.chunk_size,
            source=source,
        )
        chunks = chunks_of(session, job.id)
        session.commit()
    dispatch_job(str(job.id), lane, chunks)
    return job
