"""Chunk tasks: claim a chunk, run its stages, record its outcome.

The cpu lane runs all three stages in one task (`run_chunk`). The gpu lane splits them so
that only the model stage occupies a device worker: `prep_chunk` (cpu queue) ->
`model_chunk` (gpu queue) -> `post_chunk` (cpu queue), handing tokens and raw outputs over
through Redis. Every task is safe to run twice: results are upserted and finished chunks
are skipped; a stage whose hand-off vanished (Redis emptied) redoes the earlier stages
itself.

Each stage claims its chunk (state `running`, this worker process), and hands it on as
`queued` for the next stage, so the reconciler always knows who holds a chunk. A chunk
whose stage fails is retried (`LANEWAY_CHUNK_RETRIES`), then split in halves in-process
until the failing items stand alone: only they fail, each with a dead letter.

This module holds what Celery shapes (the task bodies, retries, time limits, the failure
path); every change of a chunk's row is a transition of jobs/chunks.py.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis
from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from celery.utils.time import get_exponential_backoff_interval

from core.obs import metrics, tracing
from core.queueing.celery_app import TRANSIENT_ERRORS, LanewayTask, app_settings
from core.store.cache import CachePlan, ResultCache, StoreBeside, cached_compute, process_cache
from core.store.redis_conn import redis_client, round_trip
from core.util.faults import model_stage_check
from core.util.isolate import Failure, isolate
from db.models import Job
from db.session import session_scope
from inference.stages import Interrupted, StageTimes, TimedRun, interruptible
from jobs import chunks
from jobs.chunks import Work
from jobs.lifecycle import cancel_key, settle
from workers.cores import CoreShare, StepAside, busy_key, host_batch_workers
from workers.devices import model_device
from workers.model_host import get_pipeline
from workers.refill import refill_soon
from workers.registry import instance_id

log = logging.getLogger(__name__)
HANDOFF_TTL = 6 * 3600  # seconds a stage's output waits in Redis for the next stage


def _cache(work: Work) -> ResultCache:
    """The result cache as the chunk's job's account may use it."""
    return process_cache(app_settings()).scoped(work.account_id)


def chunk_ended(job_id: uuid.UUID, lane: str, settings: Any) -> None:
    """A chunk of the job ended (finished, failed, cancelled): finalize the job if it was
    the last, and give the slot it freed on its lane to the next waiting chunk (on the
    worker's refill thread: this worker's own next chunk already waits in the broker)."""
    settle(job_id, settings)
    refill_soon(settings, lane)


def _claim(hostname: str | None, chunk_id: int, stage: str) -> Work | None:
    """Claim the chunk for `stage` on this worker process (jobs/chunks.claim); when the
    claim ended the chunk, settle its job and give its slot on. None: nothing to run."""
    settings = app_settings()
    claimed = chunks.claim(settings, chunk_id, stage, hostname=hostname, instance=instance_id())
    if claimed.settle is not None:
        chunk_ended(claimed.settle, claimed.lane, settings)
    return claimed.work


def _claimed(stage: str) -> Callable[[Callable[..., dict[str, Any]]], Callable[..., Any]]:
    """Every chunk task's prologue: claim the chunk for `stage` (or skip it: cancelled,
    settled, or another stage's), then run the body with the claimed work. The task keeps
    the `(self, chunk_id)` signature its messages carry."""

    def wrap(body: Callable[..., dict[str, Any]]) -> Callable[..., Any]:
        def task(self: Any, chunk_id: int) -> dict[str, Any]:
            work = _claim(self.request.hostname, chunk_id, stage)
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
    chunks.hand_on(app_settings(), work, next_stage, instance=instance_id(), **fields)


def _finish(
    work: Work,
    outputs: Sequence[dict[str, Any] | None],
    failures: Sequence[Failure | None] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Record the chunk's outcome (jobs/chunks.finish), then finalize the job if this was
    its last open chunk and give the chunk's slot on its lane to a waiting one; a copy of
    a chunk that already finished changes nothing."""
    settings = app_settings()
    outcome = chunks.finish(settings, work, outputs, failures, **fields)
    if not outcome.get("skipped"):
        chunk_ended(work.job_id, work.lane, settings)
    return outcome


def _cancelled(work: Work) -> dict[str, Any]:
    settings = app_settings()
    chunks.cancel(settings, work.chunk_id)
    chunk_ended(work.job_id, work.lane, settings)
    return {"chunk": work.chunk_id, "cancelled": True}


# Seconds between two looks of a CancelWatch at Redis. A micro-batch of a model on a CPU
# takes tens of milliseconds, so each still looks; on a GPU (or the control-plane
# benchmark's near-free model) one takes a millisecond or less, and a Redis round trip
# before each cost the worker more than the model. A cancel or an interactive request
# waits at most this much longer to be seen.
LOOK_EVERY = 0.005


class CancelWatch:
    """Asked before each micro-batch: has the job been cancelled? The Redis flag answers
    at once (looked at most every LOOK_EVERY seconds); the database, the truth should
    Redis have been emptied, every few seconds.

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
        self.next_look = 0.0  # the first micro-batch looks
        self.busy_key = busy_key()
        pause = settings.batch_yield_max if step_aside else 0.0
        pause *= host_batch_workers(settings.torch_threads)
        self.step_aside = StepAside(self.redis, max(0.0, pause)) if share else None
        self.cores = CoreShare(settings.torch_threads) if share else None

    @property
    def paused(self) -> float:
        """Seconds spent waiting for interactive work, inside the model stage."""
        return self.step_aside.paused if self.step_aside is not None else 0.0

    def _look(self) -> tuple[int, bool]:
        """The host's busy mark (milliseconds left, when sharing) and the cancel flag, in
        one round trip on this thread's own connection (`round_trip`: a look is made every
        LOOK_EVERY seconds of a chunk, and redis-py's pipeline costs as much CPU again)."""
        commands: list[tuple[str, str]] = [("EXISTS", self.key)]
        if self.step_aside is not None:
            commands.append(("PTTL", self.busy_key))
        try:
            cancelled, *mark = round_trip(self.redis, commands)
        except redis.RedisError:
            return 0, False
        return (max(0, int(mark[0])) if mark else 0), bool(cancelled)

    def __call__(self) -> bool:
        now = time.monotonic()
        if now < self.next_look:
            return False
        self.next_look = now + LOOK_EVERY
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
        chunks.requeue(settings, work.chunk_id)
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
    """The chunk's stage record of where its model stage ran: device, precision, runtime,
    and the cores this worker holds (its torch threads: what its CPU seconds are priced at)."""
    where = {"device": device, "cpu_cores": app_settings().torch_threads}
    try:
        return {**where, **get_pipeline().runtime(work.tasks)}
    except Exception as exc:  # noqa: BLE001 - a model that failed to load: record the device
        log.warning("chunk %s: no precision to record (%s)", work.chunk_id, type(exc).__name__)
        return where


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
    cache = store.cache if store is not None else _cache(work)
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
    later = StoreBeside(_cache(work))
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
        plan = CachePlan.make(_cache(work), work.tasks, work.labels, work.texts)
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
            staged = pipeline.resume(work.tasks, prepared=blob)
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
            staged = pipeline.resume(work.tasks, prepared=prepared, raw=raw)
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
    _cache(work).put(work.tasks, work.labels, todo, computed)
    return result
