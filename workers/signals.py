"""Inside one worker process: what its Celery signals start and stop.

The embedded Redis of a plain `celery -A tasks worker`, the lane check and niceness before
the pool forks, the worker's identity and queues (read by the model host and the
interactive server), tracing in each pool process, the heartbeat, the count of chunk
tasks running, and the worker's own /metrics where a pod's folder needs one. tasks/app.py
imports this module, which connects the handlers.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any

from celery.concurrency.prefork import TaskPool
from celery.signals import (
    beat_init,
    celeryd_after_setup,
    celeryd_init,
    task_postrun,
    task_prerun,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from core.obs import metrics, metrics_server, tracing
from core.queueing.celery_app import CHUNK_TASKS, app_settings, declare_queues
from core.store.redis_conn import ensure_embedded_redis
from core.vocab import GPU_QUEUES, LANES
from workers.devices import LaneError, check_lane
from workers.identity import is_interactive, set_worker, worker, worker_queues
from workers.registry import (
    TaskCounts,
    instance_id,
    new_instance_id,
    record_chunk_task,
    start_heartbeat,
    stop_heartbeat,
)

log = logging.getLogger(__name__)


_embedded: list[Any] = []


@celeryd_init.connect
@beat_init.connect
def _start_embedded_redis(**_: Any) -> None:
    """A plain `celery -A tasks worker` on the embedded default starts its own Redis."""
    handle = ensure_embedded_redis(app_settings())
    if handle is not None:
        _embedded.append(handle)


@beat_init.connect
def _trace_beat(**_: Any) -> None:
    """Beat's periodic sends start traces of their own (the reconciler, the inbox scan)."""
    try:
        tracing.configure("laneway-beat")
    except tracing.TracingError as exc:
        raise SystemExit(f"laneway: {exc}") from None


@celeryd_after_setup.connect
def _set_up_worker(sender: str, instance: Any, **_: Any) -> None:
    """A worker consuming the gpu queue needs CUDA, or LANEWAY_GPU_FALLBACK=cpu. Every
    worker gets an instance id before its pool forks, for its heartbeat."""
    settings = app_settings()
    queues = sorted(instance.app.amqp.queues.consume_from or {})
    device = None
    try:
        tracing.check()  # a malformed OTEL_* setting stops the worker, not its pool children
    except tracing.TracingError as exc:
        raise SystemExit(f"laneway: {exc}") from None
    if GPU_QUEUES & set(queues):
        try:
            device = check_lane("gpu", settings)
        except LaneError as exc:
            raise SystemExit(f"laneway: {exc}") from None
    elif "cpu" in queues or "interactive.cpu" in queues:
        device = "cpu" if settings.device == "auto" else settings.device
    if {"cpu", "gpu"} & set(queues) and settings.batch_nice:
        # Batch workers yield the CPU to interactive ones; the pool inherits the niceness.
        os.nice(settings.batch_nice)
    serial_tokenizers(queues)
    if settings.broker_is_rabbitmq:
        declare_queues(instance.app)
    set_worker(instance=new_instance_id(sender), hostname=sender, queues=queues, device=device)
    if not _forks(instance):
        tracing.configure(tracing.worker_service(queues))  # this process runs the tasks
    elif set(LANES) & set(queues):  # a batch lane's worker: its pool runs the models
        # The model code (torch, transformers) is imported here, once, before the pool
        # forks: the task modules no longer import it (inference/stages.py), and each pool
        # process would otherwise import it again instead of sharing the parent's pages.
        import inference.pipeline  # noqa: F401


def serial_tokenizers(queues: list[str], environ: MutableMapping[str, str] = os.environ) -> None:
    """An interactive worker tokenizes each batch on its own model thread. Its model threads
    run batches side by side, a core each, a few texts at a time: a fast tokenizer
    spreading a batch over every core (its Rust thread pool) takes the other threads'
    cores, so batches of a few texts run faster on one tokenizer thread each
    (bench/calibrate.py tokenizer-threads). Read by the tokenizers library at each call,
    so set before the first batch; an operator's own TOKENIZERS_PARALLELISM wins. Batch
    workers keep the pool: one batch at a time, of many texts."""
    if is_interactive(queues):
        environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _forks(instance: Any) -> bool:
    return isinstance(instance.pool_cls, type) and issubclass(instance.pool_cls, TaskPool)


@worker_process_init.connect
def _trace_pool_process(**_: Any) -> None:
    """Tracing starts in each pool process: an exporter thread does not survive a fork."""
    tracing.configure(tracing.worker_service(worker_queues()))


@worker_process_shutdown.connect
@worker_shutdown.connect
def _flush_spans(**_: Any) -> None:
    tracing.flush()


@worker_ready.connect
def _start_heartbeat(**_: Any) -> None:
    # Imported here, not above: beat and Flower load this module too, and the interactive
    # server imports torch, which only a worker needs.
    from workers import interactive_server

    if worker():
        # The interactive worker runs no chunk task: its batcher says when it is busy.
        queues = worker()["queues"]
        busy = interactive_server.activity if is_interactive(queues) else None
        start_heartbeat(**worker(), activity=busy)


@worker_ready.connect
def _serve_metrics(**_: Any) -> None:
    """With LANEWAY_WORKER_METRICS_PORT, the main process serves its host's metrics folder
    (core/obs/metrics_server.py). After the pool has forked: no pool process runs the
    thread. A port that cannot be bound is logged, not fatal: the worker's work goes on.
    Either way the job and item series start at 0 (metrics.declare_series)."""
    if metrics.DIR is None:
        return
    metrics.declare_series()
    settings = app_settings()
    if not settings.worker_metrics_port:
        return
    host, port = settings.worker_metrics_host, settings.worker_metrics_port
    try:
        metrics_server.serve_folder(metrics.DIR, host, port)
    except OSError as exc:
        log.error("no worker /metrics on %s:%s: %s", host, port, exc)
        return
    log.info("worker /metrics on %s:%s", host, port)


@worker_shutdown.connect
def _stop_heartbeat(**_: Any) -> None:
    stop_heartbeat("warm shutdown")


# The chunk tasks' starts and ends of this pool process, in order, none lost to an outage.
TASK_COUNTS = TaskCounts(record_chunk_task)


def _count_chunk_task(sender: Any, started: bool) -> None:
    """In a worker's pool process: count the chunk tasks running (idle time, cold start)."""
    if not worker() or sender is None or sender.name not in CHUNK_TASKS:
        return
    TASK_COUNTS.add(instance_id(), started)


@task_prerun.connect
def _chunk_task_started(sender: Any = None, **_: Any) -> None:
    _count_chunk_task(sender, True)


@task_postrun.connect
def _chunk_task_finished(sender: Any = None, **_: Any) -> None:
    _count_chunk_task(sender, False)


@worker_ready.connect
def _warm_interactive(**_: Any) -> None:
    """The interactive worker loads its models before its first request (a thread pool
    has no child processes to load them in)."""
    from workers import interactive_server

    if is_interactive(worker_queues()):
        interactive_server.warm_up()


@worker_shutdown.connect
def _stop_batcher(**_: Any) -> None:
    server = sys.modules.get("workers.interactive_server")  # loaded only where it served
    if server is not None:
        server.stop()
