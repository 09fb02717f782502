"""The gpu lane's elasticity from beat's side: stop idle gpu workers, measure the lanes.

Scale to zero: `laneway.scale_down` asks each gpu worker idle for longer than
LANEWAY_GPU_IDLE_TIMEOUT to shut down warm, through Celery remote control, after checking
that it runs nothing (unless LANEWAY_GPU_SCALE_DOWN=external: then something else stops
them, such as KEDA). Scale from zero is the fleet supervisor's (laneway/fleet.py): it
starts gpu workers when the gpu lane's depth is above zero.

Routing from measured costs reads `laneway.lane_stats`: throughput and seconds per item of
each lane over recent chunks, and the cold starts of recent scale-ups, kept in Redis.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import Any

import redis
from celery import shared_task
from sqlalchemy import func, select

from db.models import Chunk, Worker
from db.queries import aware, utcnow
from db.session import session_scope
from laneway.planner import LaneStats, LiveLanes
from laneway.redis_conn import redis_client
from laneway.settings import Settings, get_settings
from tasks.base import LanewayTask
from tasks.broker import lane_depths
from workers.devices import model_device
from workers.health import device_check
from workers.registry import record_event

log = logging.getLogger(__name__)
STATS_KEY = "laneway:lane_stats"
STATS_WINDOW = timedelta(hours=24)
# Fewer items than this on a lane is no measurement: the threshold decides meanwhile.
MIN_MEASURED_ITEMS = 500
COLD_STARTS_AVERAGED = 10


# --- scale to zero -------------------------------------------------------------------


def alive_workers(
    settings: Settings, lane: str | None = None, since: datetime | None = None
) -> list[Worker]:
    """Worker processes beating now, or heard from since `since` (optionally: those
    consuming `lane`)."""
    since = since or utcnow() - timedelta(seconds=settings.worker_dead_after)
    with session_scope(settings) as session:
        workers = session.scalars(
            select(Worker).where(Worker.stopped_at.is_(None), Worker.last_seen_at >= since)
        ).all()
        session.expunge_all()
    return [w for w in workers if lane is None or lane in w.queues]


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
    from tasks.app import app

    settings = settings or get_settings()
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
    """True when the worker answers that it runs no task and has none reserved."""
    inspect = app.control.inspect(destination=[hostname], timeout=2.0, limit=1)
    for ask in (inspect.active, inspect.reserved):
        replies = ask()
        if not replies or replies.get(hostname):
            return False
    return True


@shared_task(name="laneway.scale_down", base=LanewayTask)
def scale_down_task() -> dict[str, Any]:
    return {"stopped": scale_down()}


# --- measured lanes --------------------------------------------------------------------


def lane_totals(settings: Settings) -> dict[str, dict[str, Any]]:
    """Per lane, over the last day's finished range chunks: items, stage seconds, and the
    device the gpu lane's model stage ran on."""
    since = utcnow() - STATS_WINDOW
    items = Chunk.stop - Chunk.start  # range chunks; retry chunks (positions) are left out
    with session_scope(settings) as session:
        rows = session.execute(
            select(
                Chunk.queue,
                Chunk.device,
                func.sum(items),
                func.sum(func.coalesce(Chunk.pre_seconds, 0.0)),
                func.sum(func.coalesce(Chunk.model_seconds, 0.0)),
                func.sum(func.coalesce(Chunk.post_seconds, 0.0)),
            )
            .where(Chunk.state == "done", Chunk.positions.is_(None), Chunk.finished_at >= since)
            .group_by(Chunk.queue, Chunk.device)
        ).all()
    lanes: dict[str, dict[str, Any]] = {}
    for queue, device, n, pre, model, post in rows:
        lane = lanes.setdefault(
            queue, {"items": 0, "pre": 0.0, "model": 0.0, "post": 0.0, "device": "cpu"}
        )
        lane["items"] += n or 0
        lane["pre"] += pre
        lane["model"] += model
        lane["post"] += post
        if device == "cuda":
            lane["device"] = "cuda"
    return lanes


def recent_cold_starts(settings: Settings) -> list[float]:
    with session_scope(settings) as session:
        return list(
            session.scalars(
                select(Worker.cold_start_seconds)
                .where(Worker.cold_start_seconds.is_not(None))
                .order_by(Worker.first_task_at.desc())
                .limit(COLD_STARTS_AVERAGED)
            )
        )


def stats_from(lanes: dict[str, dict[str, Any]], cold_starts: list[float]) -> LaneStats | None:
    """The measured lanes, or None until both have run MIN_MEASURED_ITEMS items."""
    cpu, gpu = lanes.get("cpu"), lanes.get("gpu")
    if not cpu or not gpu or min(cpu["items"], gpu["items"]) < MIN_MEASURED_ITEMS:
        return None
    cpu_seconds = cpu["pre"] + cpu["model"] + cpu["post"]
    if cpu_seconds <= 0 or gpu["model"] <= 0:
        return None
    return LaneStats(
        cpu_items_per_second=round(cpu["items"] / cpu_seconds, 3),
        cpu_seconds_per_item=cpu_seconds / cpu["items"],
        gpu_items_per_second=round(gpu["items"] / gpu["model"], 3),
        gpu_model_seconds_per_item=gpu["model"] / gpu["items"],
        gpu_cpu_seconds_per_item=(gpu["pre"] + gpu["post"]) / gpu["items"],
        gpu_device=gpu["device"],
        cold_start_seconds=round(sum(cold_starts) / len(cold_starts), 3) if cold_starts else None,
    )


def measure_lanes(settings: Settings | None = None) -> LaneStats | None:
    """Each lane's throughput and seconds per item over the last day's chunks, and the
    recent cold starts; None until both lanes have run enough items to tell."""
    settings = settings or get_settings()
    return stats_from(lane_totals(settings), recent_cold_starts(settings))


def store_lane_stats(stats: LaneStats | None, settings: Settings) -> None:
    r = redis_client(settings)
    if stats is None:
        r.delete(STATS_KEY)
    else:
        r.set(STATS_KEY, json.dumps(stats.__dict__), ex=3600)


def read_lane_stats(settings: Settings) -> LaneStats | None:
    """The last measurement beat stored; None when there is none (or Redis is away)."""
    try:
        raw = redis_client(settings).get(STATS_KEY)
        return LaneStats(**json.loads(raw)) if raw else None
    except (redis.RedisError, ValueError, TypeError):
        return None


@shared_task(name="laneway.lane_stats", base=LanewayTask)
def lane_stats_task() -> dict[str, Any] | None:
    settings = get_settings()
    stats = measure_lanes(settings)
    store_lane_stats(stats, settings)
    return stats.__dict__ if stats else None


FLEET_KEY = "laneway:fleet:{host}"


def publish_fleet(r: redis.Redis, host: str, gpu_devices: int, ttl: int = 30) -> None:
    """A fleet supervisor tells routing how many gpu devices it can start workers on."""
    r.set(FLEET_KEY.format(host=host), json.dumps({"gpu_devices": gpu_devices}), ex=ttl)


def fleet_gpu_devices(settings: Settings) -> int | None:
    """GPU devices across the fleet: LANEWAY_GPU_DEVICES, else what the supervisors report;
    None when nobody says (workers started by hand or by Kubernetes)."""
    if settings.gpu_devices:
        return len(settings.gpu_devices)
    try:
        r = redis_client(settings)
        keys = list(r.scan_iter(FLEET_KEY.format(host="*")))
        values = r.mget(keys) if keys else []
    except redis.RedisError:
        return None
    reports = [json.loads(v)["gpu_devices"] for v in values if v]
    return sum(reports) if reports else None


def live_lanes(settings: Settings) -> LiveLanes:
    """Workers up now and each lane's waiting work (messages times the chunk size)."""
    workers = alive_workers(settings)
    try:
        r = redis_client(settings)
        backlog = {
            lane: found["depth"] * settings.chunk_size
            for lane, found in lane_depths(r, ("cpu", "gpu")).items()
        }
    except redis.RedisError:
        backlog = {"cpu": 0, "gpu": 0}
    return LiveLanes(
        cpu_workers=sum("cpu" in w.queues for w in workers),
        gpu_workers_up=sum("gpu" in w.queues for w in workers),
        gpu_devices=fleet_gpu_devices(settings),
        cpu_backlog_items=backlog["cpu"],
        gpu_backlog_items=backlog["gpu"],
    )


# --- the device health check -----------------------------------------------------------


@shared_task(name="laneway.device_health", base=LanewayTask)
def device_health() -> dict[str, Any]:
    """Run in one worker's pool process (send it to that worker's own queue)."""
    return device_check(model_device(get_settings()))
