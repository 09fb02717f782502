"""The interactive worker's server: `laneway worker interactive` (a thread pool on
`interactive.<lane>`) hands each message to `InteractiveServer.serve` (tasks/interactive.py).

Each message holds one or more small requests. The task thread hands every request to the
process's dynamic batcher (inference/dynamic.py) and waits for its answer; one model thread
runs the batches: requests of the same tasks and labels share forward passes, identical
texts are computed once and the result cache is read and filled (laneway/cache.py). A batch
that raises is split in halves until the failing items stand alone (laneway/isolate.py),
so each item gets its own result or its own error, and no request is left waiting. Answers
go back through Redis (the protocol: laneway/interactive_protocol.py). Once a batch's answers are
out, its figures go to Prometheus and to its lane's per-minute counters in Redis
(laneway/usage.py, one round trip per batch): nothing about a request is written to Postgres.
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

from inference.batching import Interrupted
from inference.dynamic import DynamicBatcher
from inference.pipeline import StageTimes, TimedRun
from laneway import metrics, tracing, usage
from laneway.cache import cached_compute, process_cache
from laneway.celery_app import app_settings
from laneway.faults import model_stage_check
from laneway.interactive_protocol import Request, answer, deliver, item_results
from laneway.isolate import Failure, isolate
from laneway.redis_conn import redis_client
from laneway.settings import INTERACTIVE_PREFIX, Settings
from laneway.yielding import BusyMark
from workers.devices import model_device
from workers.identity import worker_queues
from workers.model_host import check_device_or_stop, get_pipeline
from workers.model_host import warm_up as load_models

log = logging.getLogger(__name__)


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


def serving_queue() -> str:
    """The interactive queue this worker serves (`interactive.cpu` or `interactive.gpu`),
    which names its lane in metrics and usage."""
    found = [q for q in worker_queues() or () if q.startswith(INTERACTIVE_PREFIX)]
    return found[0] if found else INTERACTIVE_PREFIX + "cpu"


class InteractiveServer:
    """One interactive worker process's batcher, its model thread's figures, its Redis
    client and busy mark. The batcher calls `run_requests` for each batch on its model
    thread, then `record_batch` once the batch's answers are out."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.redis = redis_client(settings)
        self.busy = BusyMark(self.redis)
        self.figures: BatchFigures | None = None  # the model thread's last batch
        self._lane_device: tuple[str, str] | None = None
        self._batcher: DynamicBatcher | None = None
        self._lock = threading.Lock()

    def batcher(self) -> DynamicBatcher:
        """This process's batcher (and its model thread), started on first use."""
        with self._lock:
            if self._batcher is None:
                self._batcher = DynamicBatcher(
                    self.run_requests,
                    self.settings.batch_max,
                    self.settings.batch_wait_ms / 1000,
                    after_batch=self.record_batch,
                ).start()
            return self._batcher

    def stop(self) -> None:
        with self._lock:
            if self._batcher is not None:
                self._batcher.stop()
                self._batcher = None

    def activity(self) -> tuple[int, datetime] | None:
        """Requests in the batcher now, and since when it has been busy or idle (None
        before it starts): the interactive worker's heartbeat writes it."""
        if self._batcher is None:
            return None
        running, since = self._batcher.activity()
        return running, datetime.fromtimestamp(since, UTC)

    def run_requests(self, requests: Sequence[Request]) -> list[tuple[list[dict[str, Any]], dict]]:
        """One batch: per request, its items' results (outputs or errors) and its timing.
        Traced, the batch is a span linked to each request's span, with its stages as
        children."""
        items = sum(len(r.texts) for r in requests)
        attributes = {"laneway.batch_requests": len(requests), "laneway.batch_items": items}
        with tracing.linked_span("interactive.batch", [r.trace for r in requests], **attributes):
            answers = self._run_batch(requests)
            if self.figures is not None:
                tracing.record_stages(self.figures.spent.as_dict())
            return answers

    def _run_batch(self, requests: Sequence[Request]) -> list[tuple[list[dict[str, Any]], dict]]:
        started = time.time()
        settings = self.settings
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
        self.figures = BatchFigures(sum(len(r.texts) for r in requests), failed, spent)
        timing = {
            "started": started,
            "run": round((ran - started) * 1000, 2),
            "batch_requests": len(requests),
            "batch_items": self.figures.items,
        }
        return [(a, timing) for a in answers]

    def lane_and_device(self) -> tuple[str, str]:
        """This worker's interactive queue and model device: fixed for its life, so found
        once (the device look-up asks CUDA)."""
        if self._lane_device is None:
            self._lane_device = (serving_queue(), model_device(self.settings))
        return self._lane_device

    def record_batch(self) -> None:
        """The last batch's figures, after its answers went out: Prometheus (this
        process's files) and its lane's per-minute counters in Redis, in one round trip."""
        figures, self.figures = self.figures, None
        if figures is None:
            return
        lane, device = self.lane_and_device()
        spent = figures.spent
        metrics.record_items(lane, figures.items, figures.failed)
        metrics.record_model(lane, spent.model, spent.batches)
        try:
            cpu_seconds = spent.pre + spent.post
            usage.record(self.redis, lane, figures.items, cpu_seconds, spent.model, device)
        except redis.RedisError as exc:
            log.warning("could not count the batch's usage: %s", type(exc).__name__)

    def serve(self, messages: list[dict[str, Any]]) -> None:
        """Answer each request of a message through the batcher, then deliver the answers
        in one round trip."""
        received = time.time()
        self.busy.mark()  # batch workers on this host step aside (laneway/yielding.py)
        parsed = [Request.from_message(m) for m in messages]
        batcher = self.batcher()
        futures = [batcher.submit(req, size=len(req.texts)) for req in parsed]
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
        deliver(self.redis, answers)
        for request, body in answers:
            # The request's own trace reaches this worker (its batch span only links to it).
            tracing.record_span(
                "interactive.request",
                request.trace,
                received,
                **{"laneway.request": request.id, "laneway.status": body["status"]},
            )


_servers: list[InteractiveServer] = []
_servers_lock = threading.Lock()


def server() -> InteractiveServer:
    """This process's server, made from the worker app's settings on first use."""
    with _servers_lock:
        if not _servers:
            _servers.append(InteractiveServer(app_settings()))
        return _servers[0]


def activity() -> tuple[int, datetime] | None:
    return _servers[0].activity() if _servers else None


def warm_up() -> None:
    """Load the models and start the batcher before the first request."""
    started = time.perf_counter()
    if serving_queue() == INTERACTIVE_PREFIX + "gpu":
        check_device_or_stop(os.getpid())  # a thread pool: this process is the worker
    load_models()
    server().batcher()
    log.info("interactive models loaded in %.1f s", time.perf_counter() - started)


def stop() -> None:
    if _servers:
        _servers[0].stop()
