"""The Celery app: broker, result backend, queues and routes, all in one place."""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import beat_init, celeryd_after_setup, celeryd_init
from kombu import Queue

from laneway.settings import LANES, Settings, get_settings
from tasks.backend import backend_url
from tasks.base import visibility_timeout


def celery_config(settings: Settings) -> dict[str, Any]:
    return {
        "broker_url": settings.redis_url,
        "result_backend": backend_url(settings.redis_url),
        "broker_connection_retry_on_startup": True,
        # Longer than a reserved chunk can wait and run, or Redis redelivers a running chunk.
        "broker_transport_options": {
            "visibility_timeout": visibility_timeout(settings.chunk_timeout)
        },
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_expires": 24 * 3600,  # never 0: chords need their results
        "task_queues": [Queue(lane, routing_key=lane) for lane in LANES],
        "task_default_queue": "cpu",
        "task_routes": {
            "laneway.aggregate_job": {"queue": "cpu"},
            "laneway.reconcile": {"queue": "cpu"},
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
        "beat_schedule": {
            "reconcile": {
                "task": "laneway.reconcile",
                "schedule": float(settings.reconcile_interval),
                "options": {"expires": float(settings.reconcile_interval)},
            },
        },
    }


def make_celery(settings: Settings | None = None) -> Celery:
    celery = Celery(
        "laneway", include=["tasks.chunks", "tasks.aggregate", "tasks.maintenance", "tasks.naive"]
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


@celeryd_after_setup.connect
def _refuse_gpu_without_cuda(sender: str, instance: Any, **_: Any) -> None:
    """A worker consuming the gpu queue needs CUDA, or LANEWAY_GPU_FALLBACK=cpu."""
    from workers.devices import LaneError, check_lane

    queues = set(instance.app.amqp.queues.consume_from or {})
    if "gpu" in queues:
        try:
            check_lane("gpu", get_settings())
        except LaneError as exc:
            raise SystemExit(f"laneway: {exc}") from None
