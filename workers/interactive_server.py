"""The interactive worker's server: `laneway worker interactive` (a Celery worker of
`interactive.<lane>`, for its supervision, heartbeats and Flower) takes its lane's requests
off their Redis list with one feeder thread (`Feeder`; the protocol:
core/store/interactive_protocol.py), and answers a request sent as a Celery message too
(`InteractiveServer.serve`, tasks/interactive.py).

The feeder hands every request to the process's dynamic batcher (inference/dynamic.py);
its model threads run the batches (side by side while the model is most of a batch's
time, else one at a time): requests of the same tasks and labels share forward
passes, identical texts are computed once and the result cache is read and filled
(core/store/cache.py). A batch that raises is split in halves until the failing items stand
alone (core/util/isolate.py), so each item gets its own result or its own error, and no
request is left waiting. The model thread sends a batch's answers back through Redis in
one round trip; then, on a sender thread, its figures go to Prometheus, and its cache
entries and its lane's per-minute counters (core/store/usage.py) to Redis in one more round
trip: nothing about a request is written to Postgres.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
import torch

from core.config.settings import Settings
from core.config.startup import freeze_startup_objects
from core.obs import metrics, tracing
from core.queueing.celery_app import app_settings
from core.store import usage
from core.store.cache import StoreBeside, cached_compute, process_cache
from core.store.interactive_protocol import Popper, Request, answer, deliver, item_results, parse
from core.store.redis_conn import client_url, redis_client, round_trip
from core.util.faults import model_stage_check
from core.util.isolate import Failure, isolate
from core.vocab import INTERACTIVE_PREFIX
from inference.dynamic import DynamicBatcher
from inference.precision import choose
from inference.stages import Interrupted, StageTimes, TimedRun
from workers.cores import BusyMark
from workers.devices import model_device
from workers.identity import worker_queues
from workers.model_host import check_device_or_stop, get_pipeline
from workers.model_host import warm_up as load_models

log = logging.getLogger(__name__)


STOPPED_BEFORE = "the interactive worker stopped before this request's batch"


class Stopping(RuntimeError):
    """The server is stopping: it takes no more requests."""


@dataclass
class Incoming:
    """A request as the batcher holds it: when this worker took it, and whether off the
    Redis list (else from a Celery message)."""

    request: Request
    received: float
    listed: bool = True

    def timing(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The answer's stage timings (ms): waiting to be taken, for its batch, running."""
        return {
            "broker": round(max(0.0, self.received - self.request.sent) * 1000, 2),
            "batchwait": round(max(0.0, batch["started"] - self.received) * 1000, 2),
            **{k: v for k, v in batch.items() if k != "started"},
        }


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
    """One interactive worker process's batcher, its sender, its Redis client and busy
    mark. The batcher calls `run_requests` for each batch on a model thread, which delivers
    the answers (one round trip) and hands the rest to the sender's thread: the batch's
    cache entries and its figures, which nobody waits on."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.redis = redis_client(settings)
        self.busy = BusyMark(self.redis)
        self._lane_device: tuple[str, str] | None = None
        self._batcher: DynamicBatcher | None = None
        self._sender: ThreadPoolExecutor | None = None
        self._feeder: Feeder | None = None
        # Guards the three above and `_stopping`; re-entrant: `take` holds it while it
        # hands requests over, so a stop sees every request taken or none.
        self._lock = threading.RLock()
        self._stopping = False

    def model_threads(self) -> tuple[int, int]:
        """How many batches run side by side, and each one's torch threads: on a CPU, one
        batch per core (LANEWAY_TORCH_THREADS), each on a torch thread of its own
        (LANEWAY_INTERACTIVE_MODEL_THREADS sets the count; the cores are shared out); on
        a GPU, one. A small batch keeps several torch threads poorly busy (each forward is
        many short operations), and the web app's requests come one by one, so batches
        side by side on a core each serve more texts a second than one batch on them all
        (bench/calibrate.py model-threads re-derives this). They run side by side only
        while the model is most of a batch's time (inference/dynamic.py `SideBySide`)."""
        cores = self.settings.torch_threads
        on_cpu = self.lane_and_device()[1] == "cpu"
        threads = self.settings.interactive_model_threads or (cores if on_cpu else 1)
        return threads, max(1, cores // threads)

    def lone_threads(self) -> int:
        """Torch threads for a batch alone in the process (a lone request; no other batch
        running or due): on a CPU in fp32 or fp16 weights, every core, because there a
        small batch's products are bound by reading the weights, which more cores read
        faster. In bf16 (oneDNN's products) and on a GPU a lone forward keeps the threads
        of its share: the forward alone gains from more threads, but the whole path loses,
        since the web processes and Redis want those cores meanwhile."""
        _, torch_threads = self.model_threads()
        device = self.lane_and_device()[1]
        if device != "cpu" or choose(self.settings.precision, device).precision == "bf16":
            return torch_threads
        return max(torch_threads, self.settings.torch_threads)

    def batcher(self) -> DynamicBatcher:
        """This process's batcher (and its model threads), started on first use; once the
        server is stopping, none is started again (`Stopping`)."""
        with self._lock:
            if self._batcher is None:
                if self._stopping:
                    raise Stopping("the interactive worker is stopping")
                threads, torch_threads = self.model_threads()
                lone = self.lone_threads()

                def before_run(alone: bool) -> None:
                    torch.set_num_threads(lone if alone else torch_threads)

                # One thread stores every batch's cache entries and records its figures.
                self._sender = ThreadPoolExecutor(1, thread_name_prefix="laneway-sender")
                self._batcher = DynamicBatcher(
                    self.run_requests,
                    self.settings.batch_max,
                    self.settings.batch_wait_ms / 1000,
                    threads=threads,
                    thread_start=lambda: torch.set_num_threads(torch_threads),
                    before_run=before_run,
                ).start()
                log.info(
                    "interactive batches: %s side by side, %s torch threads each (%s for a "
                    "batch alone), TOKENIZERS_PARALLELISM=%s",
                    threads,
                    torch_threads,
                    lone,
                    os.environ.get("TOKENIZERS_PARALLELISM", "(unset: the pool on)"),
                )
            return self._batcher

    def activity(self) -> tuple[int, datetime] | None:
        """Requests in the batcher now, and since when it has been busy or idle (None
        before it starts): the interactive worker's heartbeat writes it."""
        if self._batcher is None:
            return None
        running, since = self._batcher.activity()
        return running, datetime.fromtimestamp(since, UTC)

    def run_requests(self, batch: Sequence[Incoming]) -> list[dict[str, Any]]:
        """One batch, on a model thread: every request's answer (its items' outputs or
        errors, or the request's own error when the whole batch failed), delivered to its
        caller from here in one round trip; the sender thread then stores the batch's
        cache entries and records its figures while this thread starts the next batch.
        Answers go out from this thread because a hand-off would put another thread's
        wake-up on every request's path. Traced, the batch is a span linked to each
        request's span, with its stages as children."""
        began = time.perf_counter()
        requests = [incoming.request for incoming in batch]
        items = sum(len(r.texts) for r in requests)
        attributes = {"laneway.batch_requests": len(requests), "laneway.batch_items": items}
        later: list[StoreBeside] = []  # the batch's cache entries, stored after delivery
        figures = None
        with tracing.linked_span("interactive.batch", [r.trace for r in requests], **attributes):
            try:
                results, timing, figures = self._run_batch(requests, later)
                pairs = zip(requests, results, strict=True)
                bodies = [answer(r, found, None) for r, found in pairs]
                for incoming, body in zip(batch, bodies, strict=True):
                    body["timing"] = incoming.timing(timing)
            except Exception as exc:  # noqa: BLE001 - every caller gets its answer
                log.warning("a batch of %s requests failed: %s", len(batch), exc)
                bodies = [answer(r, None, Failure.of(exc).error) for r in requests]
            if figures is not None:
                tracing.record_stages(figures.spent.as_dict())
        try:
            self.deliver(batch, bodies)
        except Exception:  # noqa: BLE001 - their callers' waits end and store them as jobs
            log.exception("could not deliver a batch of %s answers", len(batch))
        batcher = self._batcher
        if figures is not None and batcher is not None:
            batcher.ran(figures.spent.model, time.perf_counter() - began)
        sender = self._sender
        if sender is None:  # stopping: stored and recorded from here
            self.finish(batch, later, figures)
        else:
            sender.submit(self.finish, batch, later, figures)
        return bodies

    def finish(
        self,
        batch: Sequence[Incoming],
        later: Sequence[StoreBeside],
        figures: BatchFigures | None,
    ) -> None:
        """On the sender's thread, once a batch's answers are out: what nobody waits on,
        its cache entries and its figures, stored in one round trip."""
        try:
            commands = [c for entries in later for c in entries.commands()]
            if figures is not None:
                commands += self.record(figures)
            if commands:
                round_trip(self.redis, commands)
        except redis.RedisError as exc:  # a cache miss later; the minute's counters short
            log.warning("could not store a batch's cache entries and usage: %s", exc)
        except Exception:  # noqa: BLE001 - the sender must outlive one bad batch
            log.exception("could not finish a batch of %s requests", len(batch))

    def deliver(self, batch: Sequence[Incoming], bodies: Sequence[dict[str, Any]]) -> None:
        requests = [incoming.request for incoming in batch]
        try:
            deliver(self.redis, list(zip(requests, bodies, strict=True)))
        except redis.RedisError as exc:  # their callers' waits end and store them as jobs
            log.warning("could not deliver %s answers: %s", len(batch), type(exc).__name__)
        for incoming, body in zip(batch, bodies, strict=True):
            # The request's own trace reaches this worker (its batch span only links to it).
            tracing.record_span(
                "interactive.request",
                incoming.request.trace,
                incoming.received,
                **{"laneway.request": incoming.request.id, "laneway.status": body["status"]},
            )

    def _run_batch(
        self, requests: Sequence[Request], later: list[StoreBeside]
    ) -> tuple[list[list[dict[str, Any]]], dict, BatchFigures]:
        """Per request, its items' results (outputs or errors); the batch's timing and
        figures. The cache entries it made are kept back in `later`."""
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
            scoped = cache.scoped(account)
            later.append(StoreBeside(scoped))
            outputs, _ = cached_compute(scoped, tasks, labels, texts, compute, later[-1])
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
        figures = BatchFigures(sum(len(r.texts) for r in requests), failed, spent)
        timing = {
            "started": started,
            "run": round((ran - started) * 1000, 2),
            "model": round(spent.model * 1000, 2),  # of which the model stage
            "batch_requests": len(requests),
            "batch_items": figures.items,
        }
        return answers, timing, figures

    def lane_and_device(self) -> tuple[str, str]:
        """This worker's interactive queue and model device: fixed for its life, so found
        once (the device look-up asks CUDA)."""
        if self._lane_device is None:
            self._lane_device = (serving_queue(), model_device(self.settings))
        return self._lane_device

    def record(self, figures: BatchFigures) -> list[tuple[Any, ...]]:
        """A batch's figures, after its answers went out: Prometheus (this process's
        files) now; the commands that add it to its lane's per-minute counters in Redis."""
        lane, device = self.lane_and_device()
        spent = figures.spent
        metrics.record_items(lane, figures.items, figures.failed)
        metrics.record_model(lane, spent.model, spent.batches)
        cpu_seconds = spent.pre + spent.post
        return usage.record_commands(lane, figures.items, cpu_seconds, spent.model, device)

    def take(self, requests: Sequence[Request], listed: bool) -> list[Future]:
        """Hand requests to the batcher (each answered on the model thread); a synchronous
        request past its deadline is dropped: its caller has stored it as a job. Once the
        server is stopping, none is taken (`Stopping`): the caller puts them back or
        answers them. The hand-over holds the server's lock, so `stop` finds each request
        in the batcher (and puts it back) or never handed over."""
        received = time.time()
        self.busy.mark()  # batch workers on this host step aside (workers/cores.py)
        futures = []
        with self._lock:
            batcher = self.batcher()
            for request in requests:
                if request.stale(received):
                    metrics.record_stale(self.lane_and_device()[0])
                    continue
                incoming = Incoming(request, received, listed)
                futures.append(batcher.submit(incoming, size=len(request.texts)))
        return futures

    def serve(self, messages: list[dict[str, Any]]) -> None:
        """The Celery task's way in (a request sent as a message, by a web app of an
        earlier release): answered like the list's, the task's thread waits for it."""
        parsed = [Request.from_message(m) for m in messages]
        try:
            wait(self.take(parsed, listed=False))
        except Stopping:
            self.tell_stopped([Incoming(r, time.time(), listed=False) for r in parsed])

    def tell_stopped(self, batch: Sequence[Incoming]) -> None:
        """Answer requests sent as Celery messages that no batch will run: their callers
        hear at once, with an error, instead of waiting out their deadline."""
        self.deliver(batch, [answer(i.request, None, STOPPED_BEFORE) for i in batch])

    def feed(self, lane: str) -> None:
        """Start the thread that takes the lane's requests off its Redis list."""
        with self._lock:
            if self._feeder is None:
                self._feeder = Feeder(self, lane).start()

    def stop(self) -> None:
        """Stop taking requests; those taken off the list and not yet started go back to
        its head, in their order, for another worker (or this one's successor); the batch
        running finishes; a Celery task's request not started is answered with an error.
        The feeder stops first, so a request it is handing over reaches the batcher and
        is put back with the rest; no batcher starts after this."""
        with self._lock:
            self._stopping = True
            feeder, self._feeder = self._feeder, None
        if feeder is not None:
            feeder.stop()
        with self._lock:
            batcher, self._batcher = self._batcher, None
            sender, self._sender = self._sender, None
        if batcher is None:
            return
        left = batcher.drain()
        listed = [p.payload for p in left if p.payload.listed]
        if feeder is not None and listed:
            feeder.put_back([i.request for i in listed])
        self.tell_stopped([p.payload for p in left if not p.payload.listed])
        for pending in left:
            pending.future.set_result(None)
        batcher.stop()
        if sender is not None:
            sender.shutdown(wait=True)  # every batch that ran is stored and counted


class Feeder:
    """A thread that takes up to a batch of requests at a time off the lane's Redis list
    and hands them to the server's batcher. Redis away: it says so and tries again each
    second; the web app's callers meanwhile store their requests as jobs."""

    POLL = 1.0  # seconds a pop blocks: how soon a stop is seen

    def __init__(self, server: InteractiveServer, lane: str) -> None:
        self.server, self.lane = server, lane
        settings = server.settings
        self.popper = Popper(
            redis.Redis.from_url(client_url(settings.redis_url), socket_timeout=self.POLL + 10),
            lane,
        )
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="laneway-feeder", daemon=True)

    def start(self) -> Feeder:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(self.POLL + 5)

    def put_back(self, requests: Sequence[Request]) -> None:
        """Requests taken off the list and never started: back at its head, in order."""
        try:
            self.popper.put_back([r.encode() for r in requests])
            log.info("put %s requests back on the list for another worker", len(requests))
        except redis.RedisError as exc:  # their callers' waits end: stored as jobs
            log.warning("could not put %s requests back: %s", len(requests), exc)

    def run(self) -> None:
        count = self.server.settings.batch_max
        away = False
        while not self.stopping.is_set():
            try:
                raws = self.popper.pop(count, self.POLL)
            except (redis.RedisError, OSError) as exc:
                if not away:
                    log.warning("cannot take interactive requests from Redis: %s", exc)
                away = True
                self.stopping.wait(1.0)
                continue
            if away:
                log.info("taking interactive requests from Redis again")
                away = False
            requests = [r for r in map(parse, raws) if r is not None]
            if requests:
                try:
                    self.server.take(requests, listed=True)
                except Stopping:  # its stop outwaited this thread: back for another worker
                    self.put_back(requests)
                    return
                except Exception:  # noqa: BLE001 - the thread must outlive one bad take
                    log.exception("could not take %s interactive requests", len(requests))


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
    """Load the models, start the batcher, then take requests off the lane's list."""
    started = time.perf_counter()
    queue = serving_queue()
    if queue == INTERACTIVE_PREFIX + "gpu":
        check_device_or_stop(os.getpid())  # a thread pool: this process is the worker
    load_models()
    server().batcher()
    frozen = freeze_startup_objects()  # no full collection walks the models mid-request
    log.info(
        "interactive models loaded in %.1f s; %s start-up objects frozen",
        time.perf_counter() - started,
        frozen,
    )
    server().feed(queue.removeprefix(INTERACTIVE_PREFIX))


def stop() -> None:
    if _servers:
        _servers[0].stop()
