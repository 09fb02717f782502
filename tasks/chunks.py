"""Chunk tasks: read a chunk's items, run the three stages, upsert results, mark it done.

The cpu lane runs all three stages in one task (`run_chunk`). The gpu lane splits them so
that only the model stage occupies a device worker (measured in docs/benchmarks.md):
`prep_chunk` (cpu queue) -> `model_chunk` (gpu queue) -> `post_chunk` (cpu queue), handing
tokens and raw outputs over through Redis. Every task is safe to run twice: results are
upserted and finished chunks are skipped; a stage whose hand-off vanished (Redis emptied)
redoes the earlier stages itself.

Each stage claims its chunk (state `running`, this worker process), and hands it on as
`queued` for the next stage, so the reconciler always knows who holds a chunk. A chunk
whose stage fails is retried (`LANEWAY_CHUNK_RETRIES`), then split in halves in-process
until the failing items stand alone: only they fail, each with a dead letter.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from celery.utils.time import get_exponential_backoff_interval
from sqlalchemy import update

from core.obs import metrics, tracing
from core.queueing.celery_app import TRANSIENT_ERRORS, LanewayTask, app_settings
from core.queueing.dispatch import send_chunks
from core.store.cache import CachePlan, ResultCache, StoreBeside, cached_compute, process_cache
from core.store.redis_conn import redis_client
from core.util.faults import model_stage_check
from core.util.isolate import Failure, isolate
from db.common import chunk_items, mark_job_running, utcnow
from db.models import FINISHED_CHUNK_STATES, OPEN_CHUNK_STATES, Chunk, Job
from db.results import upsert_results
from db.session import after_commit, session_scope
from inference.batching import Interrupted, interruptible
from inference.pipeline import Staged, StageTimes, TimedRun
from jobs.lifecycle import (
    attempt_limit,
    cancel_key,
    dead_letter_alert,
    exhaust_chunk,
    record_dead_letters,
    settle,
)
from workers.cores import CoreShare, StepAside, busy_key
from workers.devices import model_device
from workers.model_host import get_pipeline
from workers.registry import instance_id

log = logging.getLogger(__name__)
HANDOFF_TTL = 6 * 3600  # seconds a stage's output waits in Redis for the next stage
STAGE_ORDER = {"run": 0, "prep": 0, "model": 1, "post": 2}
# The stages that hold the lane's worker: each start counts as an attempt.
COUNTED_STAGES = ("run", "model")
# How a chunk's start locks its job's row, after the chunk's (the order of every path):
# key-share, so starts of one job do not wait for each other, but one waits for a cancel
# holding the job and then reads it (jobs.lifecycle.cancel_job skips the chunk meanwhile).
JOB_LOCK_AT_START = {"read": True, "key_share": True}


@dataclass
class Work:
    chunk_id: int
    job_id: uuid.UUID
    tasks: list[str]
    labels: list[str]
    items: list[tuple[int, str, str]]
    attempts: int
    lane: str
    account_id: int | None = None  # the job's: whose result cache entries it uses

    def cache(self) -> ResultCache:
        """The result cache as the job's account may use it."""
        return process_cache(app_settings()).scoped(self.account_id)

    @property
    def texts(self) -> list[str]:
        return [text for _, _, text in self.items]


def _claim(task: Any, chunk_id: int, stage: str) -> Work | None:
    """Mark the chunk running on this worker process for `stage`, and read its work.

    None when there is nothing to do: the chunk is gone, finished, past this stage (a
    stale message), or its job is being cancelled. A chunk started too often (its workers
    keep dying on it) is split instead of run again.
    """
    settings = app_settings()
    work: Work | None = None
    halves: list[tuple[Chunk, str]] = []
    cancelled = False
    with session_scope(app_settings()) as session:
        chunk = session.get(Chunk, chunk_id, with_for_update=True)
        if chunk is None or chunk.state not in OPEN_CHUNK_STATES:
            return None
        if STAGE_ORDER[chunk.stage] > STAGE_ORDER[stage]:
            return None
        job = session.get(Job, chunk.job_id, with_for_update=JOB_LOCK_AT_START)
        assert job is not None
        counted = stage in COUNTED_STAGES
        if job.status in ("cancelling", "cancelled"):
            chunk.state, chunk.finished_at = "cancelled", utcnow()
            cancelled = True
        elif counted and chunk.attempts >= attempt_limit(settings):
            halves = exhaust_chunk(
                session,
                chunk,
                f"the chunk was started {chunk.attempts} times without finishing "
                "(its worker died or hit the time limit each time)",
            )
        else:
            chunk.state, chunk.stage = "running", stage
            chunk.worker_instance = instance_id()
            chunk.started_at = utcnow()
            if counted:
                chunk.attempts += 1
                chunk.worker = task.request.hostname
            mark_job_running(session, job.id)
            items = [(i.idx, i.item_id, i.text) for i in chunk_items(session, chunk)]
            tasks, labels = list(job.tasks), list(job.labels)
            work = Work(
                chunk.id, job.id, tasks, labels, items, chunk.attempts, chunk.queue, job.account_id
            )
            tracing.set_attributes(job=job.id, chunk=chunk.id, items=len(items), lane=chunk.queue)
        job_id = job.id
        if halves:
            after_commit(session, lambda: send_chunks(halves))
    if cancelled or (not halves and work is None):
        settle(job_id, app_settings())
    return work


def _claimed(stage: str) -> Callable[[Callable[..., dict[str, Any]]], Callable[..., Any]]:
    """Every chunk task's prologue: claim the chunk for `stage` (or skip it: cancelled,
    settled, or another stage's), then run the body with the claimed work. The task keeps
    the `(self, chunk_id)` signature its messages carry."""

    def wrap(body: Callable[..., dict[str, Any]]) -> Callable[..., Any]:
        def task(self: Any, chunk_id: int) -> dict[str, Any]:
            work = _claim(self, chunk_id, stage)
            if work is None:
                return {"chunk": chunk_id, "skipped": True}
            return body(self, work, chunk_id)

        task.__name__, task.__qualname__, task.__doc__ = (
            body.__name__,
            body.__qualname__,
            body.__doc__,
        )
        task.__module__ = body.__module__
        return task

    return wrap


def _hand_on(work: Work, next_stage: str, **fields: Any) -> None:
    """This stage is done: the chunk waits, queued, for `next_stage` on another worker."""
    with session_scope(app_settings()) as session:
        session.execute(
            update(Chunk)
            .where(
                Chunk.id == work.chunk_id,
                Chunk.state == "running",
                Chunk.worker_instance == instance_id(),
            )
            .values(
                state="queued",
                stage=next_stage,
                worker_instance=None,
                queued_at=utcnow(),
                **fields,
            )
        )


def _finish(
    work: Work,
    outputs: Sequence[dict[str, Any] | None],
    failures: Sequence[Failure | None] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Upsert the chunk's results, dead-letter its failed items, mark it done (or failed
    when every item failed), then finalize the job if this was its last open chunk."""
    failures = failures or [None] * len(work.items)
    rows = [
        {
            "idx": idx,
            "item_id": item_id,
            "label": out.get("label") if out and not failure else None,
            "output": out if not failure else None,
            "error": failure.error if failure else None,
        }
        for (idx, item_id, _), out, failure in zip(work.items, outputs, failures, strict=True)
    ]
    failed = [
        (idx, item_id, f) for (idx, item_id, _), f in zip(work.items, failures, strict=True) if f
    ]
    with session_scope(app_settings()) as session:
        # Locked, then checked: a second copy of this chunk (a redelivery while the first
        # still ran) must not overwrite the results of a copy that already finished.
        chunk = session.get(Chunk, work.chunk_id, with_for_update=True)
        if chunk is None or chunk.state in FINISHED_CHUNK_STATES:
            return {"chunk": work.chunk_id, "skipped": True}
        upsert_results(session, work.job_id, rows)
        chunk.state = "failed" if failed and len(failed) == len(rows) else "done"
        chunk.last_error = failed[0][2].error[:2000] if failed else None
        chunk.finished_at = utcnow()
        for name, value in fields.items():
            setattr(chunk, name, value)
        letters = record_dead_letters(session, chunk, failed, len(rows), work.attempts)
    metrics.record_items(work.lane, len(rows), len(failed))
    if letters:
        dead_letter_alert(work.job_id, letters, failed[0][2].error)
    settle(work.job_id, app_settings())
    return {"chunk": work.chunk_id, "items": len(rows), "failed": len(failed)}


def _cancelled(work: Work) -> dict[str, Any]:
    with session_scope(app_settings()) as session:
        session.execute(
            update(Chunk)
            .where(Chunk.id == work.chunk_id, Chunk.state.in_(OPEN_CHUNK_STATES))
            .values(state="cancelled", finished_at=utcnow())
        )
    settle(work.job_id, app_settings())
    return {"chunk": work.chunk_id, "cancelled": True}


class CancelWatch:
    """Asked before each micro-batch: has the job been cancelled? The Redis flag answers
    at once; the database, the truth should Redis have been emptied, every few seconds.

    With `share` (the model runs on this host's CPU) it also shares the host's cores with
    its interactive worker (workers/cores.py): every core while the host's busy mark is
    absent, one fewer while it stands, and with `step_aside` (the cpu lane) a wait while
    it stands. One Redis round trip reads both the cancel flag and the mark.
    """

    def __init__(
        self,
        job_id: uuid.UUID,
        db_every: float = 2.0,
        share: bool = False,
        step_aside: bool = False,
    ):
        self.job_id = job_id
        self.db_every = db_every
        self.key = cancel_key(job_id)
        settings = app_settings()
        self.redis = redis_client(settings)
        self.next_db = time.monotonic() + db_every
        self.busy_key = busy_key()
        pause = settings.batch_yield_max if step_aside else 0.0
        self.step_aside = StepAside(self.redis, max(0.0, pause)) if share else None
        self.cores = CoreShare(settings.torch_threads) if share else None

    @property
    def paused(self) -> float:
        """Seconds spent waiting for interactive work, inside the model stage."""
        return self.step_aside.paused if self.step_aside is not None else 0.0

    def _look(self) -> tuple[int, bool]:
        """The host's busy mark (milliseconds left, when sharing) and the cancel flag."""
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.exists(self.key)
            if self.step_aside is not None:
                pipe.pttl(self.busy_key)
            cancelled, *mark = pipe.execute()
        except redis.RedisError:
            return 0, False
        return (max(0, int(mark[0])) if mark else 0), bool(cancelled)

    def __call__(self) -> bool:
        left_ms, cancelled = self._look()
        if cancelled:
            return True
        if self.step_aside is not None and self.cores is not None:
            self.step_aside(left_ms)
            self.cores(busy=self.step_aside.busy)
        if time.monotonic() < self.next_db:
            return False
        self.next_db = time.monotonic() + self.db_every
        with session_scope(app_settings()) as session:
            job = session.get(Job, self.job_id)
            return job is None or job.status in ("cancelling", "cancelled")


# Failures that are nobody's item: they propagate instead of being pinned on one.
NOT_THE_ITEMS_FAULT = (Interrupted, SoftTimeLimitExceeded, *TRANSIENT_ERRORS)


def _on_failure(
    task: Any,
    work: Work,
    exc: Exception,
    run: TimedRun,
    started: float,
    **fields: Any,
) -> dict[str, Any]:
    """A stage raised. Cancellation stops the chunk; transient errors retry the task; a
    soft time limit fails the chunk whole; anything else retries, then isolates the items
    that fail by running halves of the chunk (all three stages) until they stand alone."""
    if isinstance(exc, Interrupted):
        return _cancelled(work)
    if isinstance(exc, TRANSIENT_ERRORS):
        raise exc  # autoretry_for: backoff with jitter
    if isinstance(exc, SoftTimeLimitExceeded):
        failure = Failure("the chunk exceeded its time limit (LANEWAY_CHUNK_TIMEOUT)", "")
        return _finish(work, [None] * len(work.items), [failure] * len(work.items), **fields)
    settings = app_settings()
    retries = task.request.retries
    if retries < settings.chunk_retries:
        log.warning("chunk %s failed (%s); retry %s", work.chunk_id, exc, retries + 1)
        with session_scope(app_settings()) as session:
            session.execute(
                update(Chunk)
                .where(Chunk.id == work.chunk_id, Chunk.state == "running")
                .values(state="queued", worker_instance=None, queued_at=utcnow())
            )
        countdown = get_exponential_backoff_interval(1, retries, 60, True)
        raise task.retry(exc=exc, countdown=countdown)
    log.warning(
        "chunk %s failed after %s retries; isolating its failing items", work.chunk_id, retries
    )
    try:
        with interruptible(CancelWatch(work.job_id)):
            found = isolate(work.texts, run, known_failure=exc, fatal=NOT_THE_ITEMS_FAULT)
    except Interrupted:
        return _cancelled(work)
    except SoftTimeLimitExceeded as late:
        return _on_failure(task, work, late, run, started, **fields)
    metrics.record_model(work.lane, run.spent.model, run.spent.batches)
    log.warning(
        "chunk %s: %s of %s items fail (%s runs)",
        work.chunk_id,
        len(found.failed),
        len(work.items),
        found.runs,
    )
    fields["model_seconds"] = time.perf_counter() - started
    return _finish(work, found.outputs, found.failures, **fields)


def _ran_on(device: str, work: Work) -> dict[str, Any]:
    """The chunk's stage record of where its model stage ran: device, precision, runtime."""
    try:
        return {"device": device, **get_pipeline().runtime(work.tasks)}
    except Exception as exc:  # noqa: BLE001 - a model that failed to load: record the device
        log.warning("chunk %s: no precision to record (%s)", work.chunk_id, type(exc).__name__)
        return {"device": device}


def _runner(work: Work) -> TimedRun:
    """All three stages over some of the chunk's texts, with the faults a test injects."""
    return TimedRun(get_pipeline(), work.tasks, work.labels, model_stage_check(app_settings()))


def _cached_run(
    work: Work, store: StoreBeside | None = None
) -> tuple[list[dict[str, Any]], StageTimes]:
    """All three stages over the chunk's texts that the result cache lacks (identical
    texts once), storing what it computed (by `store`, when given; else at once); zero
    times when the cache had every text."""
    run = _runner(work)
    cache = store.cache if store is not None else work.cache()
    outputs, _ = cached_compute(cache, work.tasks, work.labels, work.texts, run, store)
    return outputs, run.spent


@shared_task(name="laneway.run_chunk", bind=True, base=LanewayTask)
@_claimed("run")
def run_chunk(self: Any, work: Work, chunk_id: int) -> dict[str, Any]:
    """All three stages in one task (the cpu lane)."""
    settings = app_settings()
    device = model_device(settings)
    started = time.perf_counter()
    watch = CancelWatch(work.job_id, share=True, step_aside=True)
    later = StoreBeside(work.cache())
    try:
        with interruptible(watch):
            outputs, times = _cached_run(work, later)
    except Exception as exc:
        return _on_failure(self, work, exc, _runner(work), started, **_ran_on(device, work))
    finally:
        _log_sharing(chunk_id, watch)
    # The waits fell between micro-batches: the model stage neither ran nor cost then.
    times.model = max(0.0, times.model - watch.paused)
    metrics.record_model(work.lane, times.model, times.batches)
    tracing.record_stages(times.as_dict())
    # The result cache's entries go to Redis while the results go to the database.
    with later.storing():
        return _finish(
            work,
            outputs,
            None,
            **_ran_on(device, work),
            pre_seconds=times.pre,
            model_seconds=times.model,
            post_seconds=times.post,
        )


def _log_sharing(chunk_id: int, watch: CancelWatch) -> None:
    if watch.paused:
        log.info("chunk %s stepped aside %.2f s for interactive work", chunk_id, watch.paused)
    if watch.cores is not None and watch.cores.changes:
        log.info(
            "chunk %s changed its torch threads %s times for interactive work (now %s of %s)",
            chunk_id,
            watch.cores.changes,
            watch.cores.threads,
            watch.cores.cores,
        )


def _key(chunk_id: int, part: str) -> str:
    return f"laneway:chunk:{chunk_id}:{part}"


@shared_task(name="laneway.prep_chunk", bind=True, base=LanewayTask)
@_claimed("prep")
def prep_chunk(self: Any, work: Work, chunk_id: int) -> dict[str, Any]:
    """gpu lane, stage 1 on a cpu worker: clean and tokenize, hand the tokens over."""
    started = time.perf_counter()
    try:
        # The chunk's distinct texts the result cache lacks; the rest is known already.
        plan = CachePlan.make(work.cache(), work.tasks, work.labels, work.texts)
        if not plan.todo:  # all cached: the chunk ends here, its later stages skip it
            outputs = plan.outputs([])
            return _finish(work, outputs, None, pre_seconds=time.perf_counter() - started)
        staged = get_pipeline().pre(plan.todo, work.tasks)
    except Exception as exc:
        return _on_failure(self, work, exc, _runner(work), started)
    blob = staged.to_bytes("prepared")
    # Both in one transaction: the tokens cover exactly the plan's texts to compute.
    pipe = redis_client(app_settings()).pipeline(transaction=True)
    pipe.set(_key(chunk_id, "prepared"), blob, ex=HANDOFF_TTL)
    pipe.set(_key(chunk_id, "plan"), plan.to_json(), ex=HANDOFF_TTL)
    pipe.execute()
    pre_seconds = time.perf_counter() - started
    tracing.record_stages({"pre": pre_seconds})
    _hand_on(work, "model", pre_seconds=pre_seconds)
    return {"chunk": chunk_id, "prepared_bytes": len(blob), "computed": len(plan.todo)}


@shared_task(name="laneway.model_chunk", bind=True, base=LanewayTask)
@_claimed("model")
def model_chunk(self: Any, work: Work, chunk_id: int) -> dict[str, Any]:
    """gpu lane, stage 2 on a gpu worker: only the model stage runs here."""
    settings = app_settings()
    pipeline, r = get_pipeline(), redis_client(settings)
    device = model_device(settings)
    started = time.perf_counter()
    try:
        blob = r.get(_key(chunk_id, "prepared"))
        if blob is None:  # the hand-off was lost (Redis emptied): tokenize here instead
            staged = pipeline.pre(work.texts, work.tasks)
        else:
            staged = Staged(work.tasks)
            staged.load("prepared", blob)
        check = model_stage_check(settings)
        started = time.perf_counter()
        # On the CPU fallback it shares the host's cores as the cpu lane does (without
        # stepping aside: the gpu lane never did).
        watch = CancelWatch(work.job_id, share=device == "cpu")
        with interruptible(watch):
            if check is not None:
                check(work.texts)
            pipeline.model(staged, work.labels)
    except Exception as exc:
        return _on_failure(self, work, exc, _runner(work), started, **_ran_on(device, work))
    model_seconds = time.perf_counter() - started
    _log_sharing(chunk_id, watch)
    metrics.record_model(work.lane, model_seconds, staged.batches)
    tracing.record_stages({"model": model_seconds})
    r.set(_key(chunk_id, "raw"), staged.to_bytes("raw"), ex=HANDOFF_TTL)
    _hand_on(work, "post", **_ran_on(device, work), model_seconds=model_seconds)
    return {"chunk": chunk_id, "model_seconds": model_seconds}


@shared_task(name="laneway.post_chunk", bind=True, base=LanewayTask)
@_claimed("post")
def post_chunk(self: Any, work: Work, chunk_id: int) -> dict[str, Any]:
    """gpu lane, stage 3 on a cpu worker: scores, entities, formatting, results."""
    pipeline, r = get_pipeline(), redis_client(app_settings())
    started = time.perf_counter()
    try:
        keys = [_key(chunk_id, part) for part in ("prepared", "raw", "plan")]
        prepared, raw, planned = r.mget(keys)
        todo: Sequence[str] = []
        computed: list[dict[str, Any]] = []
        if prepared is None or raw is None:
            # A hand-off was lost: compute the chunk here rather than lose it (the cache
            # is read and filled on the way).
            log.warning("chunk %s: stage hand-off missing, running every stage here", chunk_id)
            with interruptible(CancelWatch(work.job_id)):
                outputs, spent = _cached_run(work)
            metrics.record_model(work.lane, spent.model, spent.batches)
        else:
            staged = Staged(work.tasks)
            staged.load("prepared", prepared)
            staged.load("raw", raw)
            # Without a plan (prepared before cache plans existed) the tokens cover every text.
            plan = CachePlan.from_json(work.texts, planned) if planned is not None else None
            todo = plan.todo if plan is not None else work.texts
            computed = pipeline.post(staged, todo, work.labels)
            outputs = plan.outputs(computed) if plan is not None else computed
    except Exception as exc:
        return _on_failure(self, work, exc, _runner(work), started)
    post_seconds = time.perf_counter() - started
    tracing.record_stages({"post": post_seconds})
    result = _finish(work, outputs, None, post_seconds=post_seconds)
    r.delete(*keys)
    work.cache().put(work.tasks, work.labels, todo, computed)
    return result
