"""Submitting a job: route, chunk, write it to the database, commit, then dispatch."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from core.config.settings import ModelSpec, Settings, get_settings
from core.vocab import TASKS
from db.intake import COLLECT_MAX_ITEMS, DuplicateItem, collect_items, create_job, stage_items
from db.models import Account, Job
from db.session import session_factory
from jobs import fairshare
from jobs.inputs import InputError, ItemStream, item_stream
from jobs.lanes import live_lanes, read_lane_stats, worker_speed
from jobs.lifecycle import admit
from jobs.planner import LiveLanes, Prices, Routing, chunk_size_for, plan_chunks, route

log = logging.getLogger(__name__)


@lru_cache(maxsize=16)
def model_labels(spec: ModelSpec) -> tuple[str, ...]:
    """A fine-tuned classifier's labels: the registry's, else its config's id2label."""
    if spec.labels:
        return spec.labels
    # config.json read directly: a web process need not import transformers for this.
    config = json.loads((Path(spec.path) / "config.json").read_text())
    id2label = {int(k): str(v) for k, v in (config.get("id2label") or {}).items()}
    return tuple(id2label[i] for i in sorted(id2label))


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


def choose_routing(settings: Settings, account_type: str, n_items: int, live: LiveLanes) -> Routing:
    """The lane for a job: from the lanes' measured costs and their state now (`live`), or
    from LANEWAY_GPU_THRESHOLD while nothing is measured (jobs.planner.route)."""
    return route(
        account_type,
        n_items,
        gpu_threshold=settings.gpu_threshold,
        deadline=settings.deadline(account_type),
        stats=read_lane_stats(settings) if settings.routing == "measured" else None,
        pinned=settings.routing == "threshold",
        live=live,
        prices=Prices.of(settings),
    )


def choose_chunk_size(
    settings: Settings,
    session: Session,
    lane: str,
    live: LiveLanes,
    tasks: Sequence[str],
    n_items: int,
) -> dict[str, Any]:
    """Items per chunk for a job on `lane` (jobs.planner.chunk_size_for), with what it was
    chosen from (kept in the job's routing record); read on the caller's transaction."""
    workers = live.serving(lane)
    speed = worker_speed(session, lane, list(tasks)) if settings.chunk_seconds > 0 else None
    size = chunk_size_for(
        n_items,
        floor=settings.chunk_size,
        ceiling=settings.max_chunk_size,
        target_seconds=settings.chunk_seconds,
        items_per_second=speed,
        workers=workers,
    )
    speed = round(speed, 3) if speed else None
    return {"size": size, "worker_items_per_second": speed, "workers": workers}


def store_job(
    session: Session,
    account: Account,
    items: ItemStream,
    *,
    tasks: Sequence[str] = ("classify",),
    labels: Sequence[str] | None = None,
    source: str = "api",
    settings: Settings | None = None,
    progress: Callable[[int], None] | None = None,
) -> Job:
    """Validate and write the job, its items and its chunks in the caller's transaction.

    Items stream into the database as they are read; a bad one raises InputError naming
    its place, and the caller's rollback leaves nothing behind. The lane comes from the
    routing policy. Its chunks wait for slots on their lane (jobs/fairshare.py); past the
    lane's hold limit LaneFull is raised (the caller's rollback stores nothing).
    """
    settings = settings or get_settings()
    labels = resolve_labels(settings, tasks, labels)
    small = items.in_memory is not None and items.in_memory <= COLLECT_MAX_ITEMS
    collect = collect_items if small else stage_items
    staged = collect(session, items.rows, progress)
    if staged.count == 0:
        raise InputError("the job has no items")
    # On this transaction's connection: one per job stored, whatever the burst.
    live = live_lanes(settings, session)
    routing = choose_routing(settings, account.type, staged.count, live)
    admit(session, settings, routing.lane, staged.count)
    chunking = choose_chunk_size(settings, session, routing.lane, live, tasks, staged.count)
    try:
        job = create_job(
            session,
            account_id=account.id,
            tasks=list(tasks),
            labels=labels,
            items=staged,
            lane=routing.lane,
            chunks=plan_chunks(staged.count, chunking["size"]),
            chunk_size=chunking["size"],
            source=source,
            held=True,
            routing={**routing.as_dict(), "chunking": chunking},
        )
    except DuplicateItem as dup:
        raise InputError(
            f"{items.at(dup.place)}: duplicate id {dup.item_id!r} (first at {items.at(dup.first)})"
        ) from None
    return job


def submit_job(
    account: Account,
    items: ItemStream | Iterable[tuple[str, str]],
    *,
    tasks: Sequence[str] = ("classify",),
    labels: Sequence[str] | None = None,
    source: str = "api",
    settings: Settings | None = None,
) -> Job:
    """Store the job and its items; once the rows are committed, its lane's free slots
    go to waiting chunks by fair share."""
    settings = settings or get_settings()
    if not isinstance(items, ItemStream):
        items = item_stream(items)
    with session_factory(settings)() as session:
        job = store_job(
            session, account, items, tasks=tasks, labels=labels, source=source, settings=settings
        )
        session.commit()
    # Once the session has given its connection back: the refill takes one of its own, and
    # a burst of submissions each holding one while asking for another would drain the
    # pool (an after-commit hook runs before the session lets its connection go).
    send_job(job, settings)
    return job


def send_job(job: Job, settings: Settings) -> None:
    """After the commit: top the job's lane up. Should the broker or Postgres be away,
    the job stays stored with its chunks held, which the reconciler's next round sends."""
    fairshare.safe_refill(settings, job.lane)
