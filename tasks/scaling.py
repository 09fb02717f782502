"""The gpu lane's elasticity from beat's side, and the lanes' measurement.

Scale to zero: `laneway.scale_down` asks each gpu worker idle for longer than
LANEWAY_GPU_IDLE_TIMEOUT to shut down warm, through Celery remote control, after checking
that it runs nothing (unless LANEWAY_GPU_SCALE_DOWN=external: then something else stops
them, such as KEDA). Scale from zero is the fleet supervisor's (fleet/supervisor.py): it
starts gpu workers when the gpu lane's depth is above zero. `laneway.lane_stats` measures
the lanes for routing (jobs/lanes.py).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from core.config.settings import Settings
from core.queueing.celery_app import LanewayTask, app_settings
from db.common import aware, utcnow
from db.models import Worker
from jobs.lanes import alive_workers, measure_lanes, store_lane_stats
from tasks.app import app
from workers.devices import model_device
from workers.health import device_check
from workers.registry import record_event

log = logging.getLogger(__name__)


def idle_gpu_workers(settings: Settings) -> list[tuple[Worker, float]]:
    """Alive gpu workers running no chunk for longer than LANEWAY_GPU_IDLE_TIMEOUT."""
    now = utcnow()
    idle = []
    for worker in alive_workers(settings, "gpu"):
        since = aware(worker.idle_since) or aware(worker.started_at)
        seconds = (now - since).total_seconds()
        if worker.running_tasks == 0 and seconds > settings.gpu_idle_timeout:
            idle.append((worker, seconds))
    return idle


def scale_down(settings: Settings | None = None) -> list[str]:
    """Warm-shut-down gpu workers idle too long; returns their node names.

    Each is asked first what it runs and holds (`inspect active` and `reserved`): a worker
    that answers with a task, or not at all, is left alone. A task arriving between that
    answer and the shutdown still runs to its end: a warm shutdown finishes running tasks
    and gives prefetched messages back to the broker.
    """
    settings = settings or app_settings()
    if not settings.beat_stops_gpu_workers:
        return []  # an outside autoscaler stops them (KEDA, in deploy/k8s), or nothing does
    stopped = []
    for worker, seconds in idle_gpu_workers(settings):
        if not _holds_nothing(app, worker.hostname):
            continue
        app.control.shutdown(destination=[worker.hostname])
        reason = f"idle {seconds:.0f} s > LANEWAY_GPU_IDLE_TIMEOUT={settings.gpu_idle_timeout}"
        record_event(worker.id, worker.hostname, "scale_down", reason, idle_seconds=seconds)
        log.info("scaled down %s: %s", worker.hostname, reason)
        stopped.append(worker.hostname)
    return stopped


def _holds_nothing(app: Any, hostname: str) -> bool:
    """True when the worker answers that it has no task reserved and runs none.

    Reserved first: a task goes from reserved to active (its pool process takes it), never
    back, so one moving between the two questions is in the second answer. Asked the other
    way round, a task taken between them is in neither (a worker whose pool process was
    still loading its model when the task arrived takes it just then)."""
    inspect = app.control.inspect(destination=[hostname], timeout=2.0, limit=1)
    for ask in (inspect.reserved, inspect.active):
        replies = ask()
        if not replies or replies.get(hostname):
            return False
    return True


@shared_task(name="laneway.scale_down", base=LanewayTask)
def scale_down_task() -> dict[str, Any]:
    return {"stopped": scale_down(app_settings())}


@shared_task(name="laneway.lane_stats", base=LanewayTask)
def lane_stats_task() -> dict[str, Any] | None:
    settings = app_settings()
    stats = measure_lanes(settings)
    store_lane_stats(stats, settings)
    return stats.__dict__ if stats else None


# --- the device health check -----------------------------------------------------------


@shared_task(name="laneway.device_health", base=LanewayTask)
def device_health() -> dict[str, Any]:
    """Run in one worker's pool process (send it to that worker's own queue)."""
    return device_check(model_device(app_settings()))
