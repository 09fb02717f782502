"""The Celery app's configuration, and what every Laneway task declares about reliability.

Nothing here imports a task: queues, routes and beat's schedule name tasks by their names.
The worker's entry module (tasks/app.py) adds the task modules; a web process or the
command line builds the same app from its settings and sends by name.

Messages are acknowledged after the task ends (`acks_late`), and given back to the queue
when the worker process running them dies (`reject_on_worker_lost`), so a crash never
loses one; results are upserted, so running a task twice is harmless. Transient errors
(the database or the broker dropping a connection) are retried with exponential backoff
and jitter; anything else fails the task.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import kombu.exceptions
import redis.exceptions
import sqlalchemy.exc
from celery import Celery, Task, current_app
from celery.schedules import crontab
from kombu import Queue

from core.config.settings import Settings, get_settings
from core.obs.logsafe import install_redaction
from core.queueing.result_backend import backend_url
from core.vocab import INTERACTIVE_PREFIX, LANES

APP_NAME = "laneway"
log = logging.getLogger(__name__)

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    sqlalchemy.exc.OperationalError,  # connection refused, server restarted, terminated
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.DisconnectionError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    kombu.exceptions.OperationalError,
    ConnectionError,
)


class LanewayTask(Task):
    acks_late = True
    reject_on_worker_lost = True
    autoretry_for = TRANSIENT_ERRORS
    max_retries = 8
    retry_backoff = 1  # seconds: 1, 2, 4, ... with jitter
    retry_backoff_max = 60
    retry_jitter = True


def chunk_time_limits(chunk_timeout: int) -> dict[str, int]:
    """Hard limit `LANEWAY_CHUNK_TIMEOUT`; the soft limit comes first, leaving the chunk
    time to record its items as failed before the hard limit kills the process."""
    soft = max(1, chunk_timeout - max(1, chunk_timeout // 10))
    return {"time_limit": chunk_timeout, "soft_time_limit": soft}


def visibility_timeout(chunk_timeout: int) -> int:
    """Redis redelivers an unacknowledged message after this many seconds. A chunk retried
    with a countdown (60 s at most) is held beside the chunk its worker runs, waits for it,
    then runs: the timeout must exceed two hard limits and the countdown, or running
    chunks would be delivered twice."""
    return 2 * chunk_timeout + 60


# Chord callbacks, the reconciler and alerts: short tasks that must not wait behind a lane's
# backlog of chunks. `laneway worker cpu` consumes it beside `cpu`.
MAINTENANCE_QUEUE = "maintenance"
# Interactive requests: a queue per lane that batch chunks never use.
INTERACTIVE_QUEUES = tuple(INTERACTIVE_PREFIX + lane for lane in LANES)
QUEUES = (*LANES, MAINTENANCE_QUEUE, *INTERACTIVE_QUEUES)
# The tasks that occupy a lane's worker: a worker running none of them is idle.
CHUNK_TASKS = frozenset(
    {"laneway.run_chunk", "laneway.prep_chunk", "laneway.model_chunk", "laneway.post_chunk"}
)


def rabbitmq_config(settings: Settings) -> dict[str, Any]:
    """What RabbitMQ as the broker adds. Every Laneway queue is a quorum queue: durable and
    replicated, it keeps a confirmed publish across a broker restart, and its
    `x-delivery-limit` drops a message that keeps killing its worker (settings.
    broker_delivery_limit says why that count). Publishes wait for the broker's confirm, so
    a send that returns is stored. Celery then consumes with per-consumer QoS (quorum
    queues have no global QoS: `worker_detect_quorum_queues`) and sends countdowns through
    its native delayed delivery, which routes through topic exchanges: Laneway's default
    exchange is one (its routing keys are the queue names, as with a direct exchange)."""
    arguments = {"x-queue-type": "quorum", "x-delivery-limit": settings.broker_delivery_limit}
    return {
        "broker_transport_options": {"confirm_publish": True},
        "task_queues": [
            Queue(name, routing_key=name, queue_arguments=arguments) for name in QUEUES
        ],
        "task_default_queue_type": "quorum",
        "task_default_exchange_type": "topic",
        "worker_detect_quorum_queues": True,
        "broker_native_delayed_delivery_queue_type": "quorum",
    }


def redis_broker_config(settings: Settings) -> dict[str, Any]:
    return {
        # Longer than a reserved chunk can wait and run, or Redis redelivers a running chunk.
        "broker_transport_options": {
            "visibility_timeout": visibility_timeout(settings.longest_chunk_timeout)
        },
        "task_queues": [Queue(name, routing_key=name) for name in QUEUES],
    }


def celery_config(settings: Settings) -> dict[str, Any]:
    """The app's configuration; the broker is whatever settings.broker names (Redis unless
    LANEWAY_BROKER_URL says amqp://), the result backend always Redis."""
    broker = rabbitmq_config if settings.broker_is_rabbitmq else redis_broker_config
    config = {
        "broker_url": settings.broker,
        "result_backend": backend_url(settings.redis_url),
        "broker_connection_retry_on_startup": True,
        **broker(settings),
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_expires": 24 * 3600,  # never 0: chords need their results
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


def declare_queues(app: Celery) -> None:
    """Declare every Laneway queue on RabbitMQ, as a worker starts: Celery's native delayed
    delivery binds each of the app's queues to its delay exchanges, and a queue that no
    worker consumed yet is not there to bind (a countdown routed to it would be dropped).
    A broker away now leaves it to Celery's own retries, which declare as they consume."""
    try:
        with app.connection_for_write() as conn:
            channel = conn.default_channel
            for name in QUEUES:
                app.amqp.queues[name].bind(channel).declare()
    except (kombu.exceptions.OperationalError, OSError) as exc:
        log.warning("could not declare the queues on RabbitMQ: %s", exc)


def scale_down_interval(settings: Settings) -> int:
    """How often beat looks for idle gpu workers: often enough to honour the idle timeout."""
    return max(1, min(settings.reconcile_interval, settings.gpu_idle_timeout // 2))


def make_celery(settings: Settings, include: Sequence[str] = ()) -> Celery:
    """The Celery app for `settings`, made the process's default. The web factory
    (webapp.celery_init_app), the worker's entry module (tasks/app.py, which names the
    task modules in `include`) and the command line each build theirs with this."""
    # Workers log task errors and tracebacks: keep keys and passwords out of them.
    install_redaction()
    celery = Celery(APP_NAME, include=list(include))
    celery.conf.update(celery_config(settings))
    celery.laneway_settings = settings  # type: ignore[attr-defined]
    # @shared_task binds to the current app, which is thread-local unless set as default:
    # without this a web server's second thread would send chords through an unset app.
    celery.set_default()
    return celery


def app_settings() -> Settings:
    """The settings the current Celery app was built from: what a task reads. A test that
    builds an app from its own settings runs tasks with them, without patching modules."""
    settings = getattr(current_app, "laneway_settings", None)
    return settings if isinstance(settings, Settings) else get_settings()


def sending_app() -> Celery:
    """The app services send through: the one the entry room built (Flask's factory, the
    worker, the command line), else one from the environment's settings. Never Celery's
    own unconfigured default, which would send to a broker nobody named."""
    app = current_app._get_current_object()
    if app.main != APP_NAME:
        app = make_celery(get_settings())
    return app
