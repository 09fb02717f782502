"""The interactive worker: `laneway worker interactive` (a thread pool on `interactive.<lane>`).

Each message holds one or more small requests. The task thread hands every request to the
process's dynamic batcher (inference/dynamic.py) and waits for its answer; one model thread
runs the batches: requests of the same tasks and labels share forward passes, identical
texts are computed once and the result cache is read and filled (laneway/cache.py). A batch
that raises is split in halves until the failing items stand alone (laneway/isolate.py),
so each item gets its own result or its own error, and no request is left waiting. Answers
go back through Redis (laneway/interactive.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import wait
from typing import Any

from celery import shared_task
from celery.signals import worker_ready, worker_shutdown

from inference.batching import Interrupted
from inference.dynamic import DynamicBatcher
from laneway.cache import ResultCache, cached_compute
from laneway.faults import model_stage_check
from laneway.interactive import Request, answer, deliver, item_results
from laneway.isolate import Failure, isolate
from laneway.redis_conn import redis_client
from laneway.settings import get_settings

log = logging.getLogger(__name__)
INTERACTIVE_PREFIX = "interactive."
_state: dict[str, Any] = {}
_lock = threading.Lock()


def is_interactive(queues: Sequence[str] | None) -> bool:
    """A worker of interactive queues alone (beside its own `<node>.dq` queue)."""
    queues = list(queues or ())
    return any(q.startswith(INTERACTIVE_PREFIX) for q in queues) and not {"cpu", "gpu"} & set(
        queues
    )


def run_requests(requests: Sequence[Request]) -> list[tuple[list[dict[str, Any]], dict]]:
    """One batch: per request, its items' results (outputs or errors) and its timing."""
    started = time.time()
    from workers.model_host import get_pipeline

    settings = get_settings()
    pipeline, check = get_pipeline(settings), model_stage_check(settings)
    cache = _state.setdefault("cache", ResultCache(redis_client(settings), settings))
    groups: dict[tuple, list[int]] = defaultdict(list)
    for n, request in enumerate(requests):
        groups[(tuple(request.tasks), tuple(request.labels))].append(n)
    answers: list[list[dict[str, Any]]] = [[] for _ in requests]
    for (tasks, labels), members in groups.items():

        def run(texts: Sequence[str], tasks=tasks, labels=labels) -> list[dict[str, Any]]:
            return pipeline.run(texts, tasks, labels, before_model=check)[0]

        def compute(texts: Sequence[str], run=run) -> list[Any]:
            found = isolate(texts, run, fatal=(Interrupted,))
            pairs = zip(found.outputs, found.failures, strict=True)
            return [f if f is not None else o for o, f in pairs]

        texts = [t for n in members for t in requests[n].texts]
        outputs, _ = cached_compute(cache, tasks, labels, texts, compute)
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
    timing = {
        "started": started,
        "run": round((ran - started) * 1000, 2),
        "batch_requests": len(requests),
        "batch_items": sum(len(r.texts) for r in requests),
    }
    return [(a, timing) for a in answers]


def batcher() -> DynamicBatcher:
    """This process's batcher (and its model thread), started on first use."""
    with _lock:
        if "batcher" not in _state:
            settings = get_settings()
            _state["batcher"] = DynamicBatcher(
                run_requests, settings.batch_max, settings.batch_wait_ms / 1000
            ).start()
        return _state["batcher"]


@shared_task(name="laneway.interactive", acks_late=False, ignore_result=True)
def interactive(requests: list[dict[str, Any]]) -> None:
    """Answer each request of the message through the batcher. Acknowledged on receipt: a
    request lost with its worker is the web app's to recover (it stores a job at its
    timeout), and a late redelivery would only compute what nobody waits for."""
    received = time.time()
    parsed = [Request.from_message(m) for m in requests]
    r = _state.get("redis") or _state.setdefault("redis", redis_client(get_settings()))
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


@worker_ready.connect
def _warm_interactive(**_: Any) -> None:
    """The interactive worker loads its models before its first request (a thread pool
    has no child processes to load them in)."""
    from tasks.app import worker_queues

    if not is_interactive(worker_queues()):
        return
    from workers.model_host import warm_up

    started = time.perf_counter()
    warm_up()
    batcher()
    log.info("interactive models loaded in %.1f s", time.perf_counter() - started)


@worker_shutdown.connect
def _stop_batcher(**_: Any) -> None:
    if "batcher" in _state:
        _state.pop("batcher").stop()
