"""The interactive worker: `laneway worker interactive` (a thread pool on `interactive.<lane>`).

Each message holds one or more small requests. The task thread hands every request to the
process's dynamic batcher (inference/dynamic.py) and waits for its answer; one model thread
runs the batches: requests of the same tasks and labels share forward passes, identical
texts are computed once and the result cache is read and filled (laneway/cache.py). A batch
that raises is split in halves until the failing items stand alone (laneway/isolate.py),
so each item gets its own result or its own error, and no request is left waiting. Answers
go back through Redis (laneway/interactive.py). Once a batch's answers are out, its figures
go to Prometheus and to its lane's per-minute counters in Redis (laneway/usage.py, one
round trip per batch): nothing about a request is written to Postgres.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import wait
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from celery import shared_task
from celery.signals import worker_ready, worker_shutdown

from inference.batching import Interrupted
from inference.dynamic import DynamicBatcher
from inference.pipeline import StageTimes, TimedRun
from laneway import metrics, tracing, usage
from laneway.cache import cached_compute, process_cache
from laneway.faults import model_stage_check
from laneway.interactive import Request, answer, deliver, item_results
from laneway.isolate import Failure, isolate
from laneway.redis_conn import redis_client
from laneway.settings import INTERACTIVE_PREFIX, get_settings
from laneway.yielding import BusyMark

log = logging.getLogger(__name__)
_state: dict[str, Any] = {}
_lock = threading.Lock()


def is_interactive(queues: Sequence[str] | None) -> bool:
    """A worker of interactive queues alone (beside its own `<node>.dq` queue)."""
    queues = list(queues or ())
    return any(q.startswith(INTERACTIVE_PREFIX) for q in queues) and not {"cpu", "gpu"} & set(
        queues
    )


@dataclass
class BatchFigures:
    """What a batch did: items answered, items failed, the stages' time and batches."""

    items: int
    failed: int
    spent: StageTimes


def run_requests(requests: Sequence[Request]) -> list[tuple[list[dict[str, Any]], dict]]:
    """One batch: per request, its items' results (outputs or errors) and its timing. Traced,
    the batch is a span linked to each request's span, with its stages as children."""
    items = sum(len(r.texts) for r in requests)
    attributes = {"laneway.batch_requests": len(requests), "laneway.batch_items": items}
    with tracing.linked_span("interactive.batch", [r.trace for r in requests], **attributes):
        answers = _run_batch(requests)
        figures: BatchFigures | None = _state.get("figures")
        if figures is not None:
            tracing.record_stages(figures.spent.as_dict())
        return answers


def _run_batch(requests: Sequence[Request]) -> list[tuple[list[dict[str, Any]], dict]]:
    started = time.time()
    from workers.model_host import get_pipeline

    settings = get_settings()
    pipeline, check = get_pipeline(settings), model_stage_check(settings)
    cache, spent = process_cache(settings), StageTimes()
    groups: dict[tuple, list[int]] = defaultdict(list)
    for n, request in enumerate(requests):
        # Per account too: each reads and fills only its own cache entries.
        groups[(tuple(request.tasks), tuple(request.labels), request.account)].append(n)
    answers: list[list[dict[str, Any]]] = [[] for _ in requests]
    failed = 0
    for (tasks, labels, account), members in groups.items():
        run = TimedRun(pipeline, tasks, labels, check, spent)

        def compute(texts: Sequence[str], run=run) -> list[Any]:
            found = isolate(texts, run, fatal=(Interrupted,))
            pairs = zip(found.outputs, found.failures, strict=True)
            return [f if f is not None else o for o, f in pairs]

        texts = [t for n in members for t in requests[n].texts]
        outputs, _ = cached_compute(cache.scoped(account), tasks, labels, texts, compute)
        failed += sum(isinstance(o, Failure) for o in outputs)
        start = 0
        for n in members:
            part = outputs[start : start + len(requests[n].texts)]
            start += len(part)
            answers[n] = item_results(
                requests[n].ids,
                [o if isinstance(o, dict) else None for o in part],
                [o.error if isinstance(o, Failure) else None for o in part],
            )
    ran = time.time()
    # Recorded by record_batch once the answers are out (the model thread runs both).
    _state["figures"] = BatchFigures(sum(len(r.texts) for r in requests), failed, spent)
    timing = {
        "started": started,
        "run": round((ran - started) * 1000, 2),
        "batch_requests": len(requests),
        "batch_items": sum(len(r.texts) for r in requests),
    }
    return [(a, timing) for a in answers]


def serving_queue() -> str:
    """The interactive queue this worker serves (`interactive.cpu` or `interactive.gpu`),
    which names its lane in metrics and usage."""
    from tasks.app import worker_queues

    found = [q for q in worker_queues() or () if q.startswith(INTERACTIVE_PREFIX)]
    return found[0] if found else INTERACTIVE_PREFIX + "cpu"


def lane_and_device() -> tuple[str, str]:
    """This worker's interactive queue and model device: fixed for its life, so found once
    (the device look-up asks CUDA)."""
    if "lane_device" not in _state:
        from workers.devices import model_device

        _state["lane_device"] = (serving_queue(), model_device(get_settings()))
    return _state["lane_device"]


def record_batch() -> None:
    """The last batch's figures, after its answers went out: Prometheus (this process's
    files) and its lane's per-minute counters in Redis, in one round trip."""
    figures: BatchFigures | None = _state.pop("figures", None)
    if figures is None:
        return
    lane, device = lane_and_device()
    spent = figures.spent
    metrics.record_items(lane, figures.items, figures.failed)
    metrics.record_model(lane, spent.model, spent.batches)
    try:
        usage.record(_redis(), lane, figures.items, spent.pre + spent.post, spent.model, device)
    except redis.RedisError as exc:
        log.warning("could not count the batch's usage: %s", type(exc).__name__)


def _redis() -> redis.Redis:
    return _state.get("redis") or _state.setdefault("redis", redis_client(get_settings()))


def busy_mark() -> BusyMark:
    return _state.get("busy") or _state.setdefault("busy", BusyMark(_redis()))


def batcher() -> DynamicBatcher:
    """This process's batcher (and its model thread), started on first use."""
    with _lock:
        if "batcher" not in _state:
            settings = get_settings()
            _state["batcher"] = DynamicBatcher(
                run_requests,
                settings.batch_max,
                settings.batch_wait_ms / 1000,
                after_batch=record_batch,
            ).start()
        return _state["batcher"]


def activity() -> tuple[int, datetime] | None:
    """Requests in this process's batcher now, and since when it has been busy or idle
    (None before it starts): the interactive worker's heartbeat writes it."""
    found = _state.get("batcher")
    if found is None:
        return None
    running, since = found.activity()
    return running, datetime.fromtimestamp(since, UTC)


@shared_task(name="laneway.interactive", acks_late=False, ignore_result=True)
def interactive(requests: list[dict[str, Any]]) -> None:
    """Answer each request of the message through the batcher. Acknowledged on receipt: a
    request lost with its worker is the web app's to recover (it stores a job at its
    timeout), and a late redelivery would only compute what nobody waits for."""
    received = time.time()
    busy_mark().mark()  # batch workers on this host step aside (laneway/yielding.py)
    parsed = [Request.from_message(m) for m in requests]
    r = _redis()
    futures = [batcher().submit(req, size=len(req.texts)) for req in parsed]
    wait(futures)
    answers = []
    for request, future in zip(parsed, futures, strict=True):
        exc = future.exception()
        if exc is None:
            results, timing = future.result()
            body = answer(request, results, None)
            body["timing"] = {
                "broker": round(max(0.0, received - request.sent) * 1000, 2),
                "batchwait": round(max(0.0, timing["started"] - received) * 1000, 2),
                **{k: v for k, v in timing.items() if k != "started"},
            }
        else:
            body = answer(request, None, Failure.of(exc).error)
        answers.append((request, body))
    deliver(r, answers)
    for request, body in answers:
        # The request's own trace reaches this worker (its batch span only links to it).
        tracing.record_span(
            "interactive.request",
            request.trace,
            received,
            **{"laneway.request": request.id, "laneway.status": body["status"]},
        )


@worker_ready.connect
def _warm_interactive(**_: Any) -> None:
    """The interactive worker loads its models before its first request (a thread pool
    has no child processes to load them in)."""
    from tasks.app import worker_queues

    if not is_interactive(worker_queues()):
        return
    from workers.model_host import warm_up

    started = time.perf_counter()
    if serving_queue() == INTERACTIVE_PREFIX + "gpu":
        from workers.model_host import check_device_or_stop

        check_device_or_stop(os.getpid())  # a thread pool: this process is the worker
    warm_up()
    batcher()
    log.info("interactive models loaded in %.1f s", time.perf_counter() - started)


@worker_shutdown.connect
def _stop_batcher(**_: Any) -> None:
    if "batcher" in _state:
        _state.pop("batcher").stop()
