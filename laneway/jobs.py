"""Submitting a job: route, chunk, write it to the database, commit, then dispatch."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from db.models import Account, Job
from db.queries import chunks_of, create_job
from db.session import session_factory
from laneway.inputs import InputError
from laneway.planner import choose_lane, plan_chunks
from laneway.settings import TASKS, ModelSpec, Settings, get_settings


@lru_cache(maxsize=16)
def model_labels(spec: ModelSpec) -> tuple[str, ...]:
    """A fine-tuned classifier's labels: the registry's, else its config's id2label."""
    if spec.labels:
        return spec.labels
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(spec.path)
    return tuple(config.id2label[i] for i in range(len(config.id2label)))


def resolve_labels(
    settings: Settings, tasks: Sequence[str], given: Sequence[str] | None
) -> list[str]:
    """The labels a job classifies into: the job's (zero-shot) or the fine-tuned model's."""
    if "classify" not in tasks:
        return []
    spec = settings.model_for("classify")
    assert spec is not None
    if spec.kind == "embedding":
        return list(given or settings.default_labels)
    fixed = list(model_labels(spec))
    if given and set(given) != set(fixed):
        raise InputError(
            f"labels: the classify model {spec.name!r} has fixed labels "
            f"({', '.join(fixed)}); omit 'labels' or name exactly those"
        )
    return fixed


def parse_tasks(raw_tasks: object, raw_task: object) -> list[str]:
    """`tasks` (a list) or `task` (one name); each known, none twice."""
    if raw_tasks is not None and raw_task is not None:
        raise InputError("send either 'task' or 'tasks', not both")
    if raw_tasks is None:
        raw_tasks = [raw_task if raw_task is not None else "classify"]
    elif isinstance(raw_tasks, str):
        raw_tasks = [t.strip() for t in raw_tasks.split(",") if t.strip()]
    if not isinstance(raw_tasks, list) or not raw_tasks:
        raise InputError("'tasks' must be a non-empty list of task names")
    for task in raw_tasks:
        if not isinstance(task, str) or task not in TASKS:
            raise InputError(f"unknown task {task!r}; known tasks: {', '.join(TASKS)}")
    if len(set(raw_tasks)) != len(raw_tasks):
        raise InputError("'tasks' names a task twice")
    return list(raw_tasks)


def submit_job(
    account: Account,
    items: Sequence[tuple[str, str]],
    *,
    tasks: Sequence[str] = ("classify",),
    labels: Sequence[str] | None = None,
    source: str = "api",
    settings: Settings | None = None,
) -> Job:
    """Store the job and its items, then send its chord once the rows are committed."""
    from tasks.dispatch import dispatch_job

    settings = settings or get_settings()
    labels = resolve_labels(settings, tasks, labels)
    lane = choose_lane(account.type, len(items), settings.gpu_threshold)
    with session_factory(settings)() as session:
        job = create_job(
            session,
            account_id=account.id,
            tasks=list(tasks),
            labels=labels,
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
