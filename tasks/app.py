"""The Celery app: broker, result backend, queues and routes, all in one place."""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery
from celery.schedules import crontab
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
from kombu import Queue

from laneway import tracing
from laneway.logsafe import install_redaction
from laneway.settings import GPU_QUEUES, INTERACTIVE_PREFIX, LANES, Settings, get_settings
from laneway.yielding import openmp_env
from tasks.backend import backend_url
from tasks.base import visibility_timeout

# Idle OpenMP threads spin briefly, then sleep: on a shared CPU a long-spinning batch worker
# would take the cores an interactive request needs. Set before torch is imported.
os.environ.update(openmp_env())

# Chord callbacks, the reconciler and alerts: short tasks that must not wait behind a lane's
# backlog of chunks. `laneway worker cpu` consumes it beside `cpu`.
MAINTENANCE_QUEUE = "maintenance"
# Interactive requests (issue 6): a queue per lane that batch chunks never use.
INTERACTIVE_QUEUES = tuple(INTERACTIVE_PREFIX + lane for lane in LANES)
QUEUES = (*LANES, MAINTENANCE_QUEUE, *INTERACTIVE_QUEUES)
# The tasks that occupy a lane's worker: a worker running none of them is idle.
CHUNK_TASKS = frozenset(
    {"laneway.run_chunk", "laneway.prep_chunk", "laneway.model_chunk", "laneway.post_chunk"}
)
log = logging.getLogger(__name__)


def celery_config(settings: Settings) -> dict[str, Any]:
    config = {
        "broker_url": settings.redis_url,
        "result_backend": backend_url(settings.redis_url),
        "broker_connection_retry_on_startup": True,
        # Longer than a reserved chunk can wait and run, or Redis redelivers a running chunk.
        "broker_transport_options": {
            "visibility_timeout": visibility_timeout(settings.longest_chunk_timeout)
        },
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_expires": 24 * 3600,  # never 0: chords need their results
        "task_queues": [Queue(name, routing_key=name) for name in QUEUES],
        "task_default_queue": "cpu",
        "task_routes": {
            "laneway.aggregate_job": {"queue": MAINTENANCE_QUEUE},
            "laneway.reconcile": {"queue": MAINTENANCE_QUEUE},
            "laneway.send_alert": {"queue": MAINTENANCE_QUEUE},
            "laneway.scale_down": {"queue": MAINTENANCE_QUEUE},
            "laneway.lane_stats": {"queue": MAINTENANCE_QUEUE},
            # The nightly path: ingest and outbox files are batch work, beside the chunks.
            "laneway.scan_inbox": {"queue": "cpu"},
            "laneway.write_outbox": {"queue": "cpu"},
            "laneway.notify_webhook": {"queue": MAINTENANCE_QUEUE},
            # Chunks go to the queue their job's lane names, set per call at dispatch.
        },
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_track_started": True,
        "worker_prefetch_multiplier": 1,
        # Loading torch and the model in a fresh child takes seconds; the default 4 s kills it.
        "worker_proc_alive_timeout": 120,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        # Each worker also consumes a queue of its own (`<node>.dq`): the device health
        # check is sent to one worker.
        "worker_direct": True,
        # Touches a heartbeat file on every tick, for `laneway probe beat` (tasks/beat.py).
        "beat_scheduler": "tasks.beat:HeartbeatScheduler",
        "beat_schedule": {
            # Expiry bounds the pile-up while no worker serves the maintenance queue; it is
            # generous because a busy cpu worker takes maintenance tasks between chunks.
            "reconcile": {
                "task": "laneway.reconcile",
                "schedule": float(settings.reconcile_interval),
                "options": {"expires": float(max(60, 3 * settings.reconcile_interval))},
            },
            "lane-stats": {
                "task": "laneway.lane_stats",
                "schedule": 60.0,
                "options": {"expires": 60.0},
            },
            # Nightly by default (LANEWAY_INBOX_SCHEDULE, in UTC).
            "inbox": {
                "task": "laneway.scan_inbox",
                "schedule": crontab.from_string(settings.inbox_schedule),
            },
        },
    }
    if settings.beat_stops_gpu_workers:
        config["beat_schedule"]["scale-down"] = {
            "task": "laneway.scale_down",
            "schedule": float(scale_down_interval(settings)),
            "options": {"expires": 60.0},
        }
    return config


def scale_down_interval(settings: Settings) -> int:
    """How often beat looks for idle gpu workers: often enough to honour the idle timeout."""
    return max(1, min(settings.reconcile_interval, settings.gpu_idle_timeout // 2))


def make_celery(settings: Settings | None = None) -> Celery:
    # Workers log task errors and tracebacks: keep keys and passwords out of them.
    install_redaction()
    celery = Celery(
        "laneway",
        include=[
            "tasks.chunks",
            "tasks.aggregate",
            "tasks.maintenance",
            "tasks.alerts",
            "tasks.scaling",
            "tasks.inbox",
            "tasks.naive",
            "tasks.interactive",
        ],
    )
    celery.conf.update(celery_config(settings or get_settings()))
    # @shared_task binds to the current app, which is thread-local unless set as default:
    # without this a web server's second thread would send chords through an unset app.
    celery.set_default()
    return celery


app = make_celery()

_embedded: list[Any] = []


@celeryd_init.connect
@beat_init.connect
def _start_embedded_redis(**_: Any) -> None:
    """A plain `celery -A tasks worker` on the embedded default starts its own Redis."""
    from laneway.redis_conn import ensure_embedded_redis

    handle = ensure_embedded_redis(get_settings())
    if handle is not None:
        _embedded.append(handle)


@beat_init.connect
def _trace_beat(**_: Any) -> None:
    """Beat's periodic sends start traces of their own (the reconciler, the inbox scan)."""
    try:
        tracing.configure("laneway-beat")
    except tracing.TracingError as exc:
        raise SystemExit(f"laneway: {exc}") from None


_worker: dict[str, Any] = {}


@celeryd_after_setup.connect
def _set_up_worker(sender: str, instance: Any, **_: Any) -> None:
    """A worker consuming the gpu queue needs CUDA, or LANEWAY_GPU_FALLBACK=cpu. Every
    worker gets an instance id before its pool forks, for its heartbeat."""
    from workers.devices import LaneError, check_lane
    from workers.registry import new_instance_id

    settings = get_settings()
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
    _worker.update(instance=new_instance_id(sender), hostname=sender, queues=queues, device=device)
    if not _forks(instance):
        tracing.configure(tracing.worker_service(queues))  # this process runs the tasks


def _forks(instance: Any) -> bool:
    from celery.concurrency.prefork import TaskPool

    return isinstance(instance.pool_cls, type) and issubclass(instance.pool_cls, TaskPool)


@worker_process_init.connect
def _trace_pool_process(**_: Any) -> None:
    """Tracing starts in each pool process: an exporter thread does not survive a fork."""
    tracing.configure(tracing.worker_service(worker_queues()))


@worker_process_shutdown.connect
@worker_shutdown.connect
def _flush_spans(**_: Any) -> None:
    tracing.flush()


def worker_queues() -> list[str] | None:
    """The queues this worker consumes (in its pool children too: set before the fork)."""
    return _worker.get("queues")


@worker_ready.connect
def _start_heartbeat(**_: Any) -> None:
    from tasks.interactive import activity, is_interactive
    from workers.registry import start_heartbeat

    if _worker:
        # The interactive worker runs no chunk task: its batcher says when it is busy.
        busy = activity if is_interactive(_worker["queues"]) else None
        start_heartbeat(**_worker, activity=busy)


@worker_shutdown.connect
def _stop_heartbeat(**_: Any) -> None:
    from workers.registry import stop_heartbeat

    stop_heartbeat("warm shutdown")


def _count_chunk_task(sender: Any, started: bool) -> None:
    """In a worker's pool process: count the chunk tasks running (idle time, cold start)."""
    if not _worker or sender is None or sender.name not in CHUNK_TASKS:
        return
    from workers.registry import instance_id, task_finished, task_started

    try:
        (task_started if started else task_finished)(instance_id())
    except Exception as exc:  # noqa: BLE001 - bookkeeping must never fail a chunk
        log.warning("could not record the chunk task's %s: %s", started, type(exc).__name__)


@task_prerun.connect
def _chunk_task_started(sender: Any = None, **_: Any) -> None:
    _count_chunk_task(sender, True)


@task_postrun.connect
def _chunk_task_finished(sender: Any = None, **_: Any) -> None:
    _count_chunk_task(sender, False)
