"""What routing knows of the lanes: the workers alive, each lane's backlog, the gpu
devices the fleet can start workers on, and each lane's measured cost.

Routing from measured costs reads what `laneway.lane_stats` (tasks/scaling.py) stores:
throughput and seconds per item of each lane over recent chunks, and the cold starts of
recent scale-ups, kept in Redis.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.config.settings import Settings, get_settings
from core.store.redis_conn import redis_client
from db import common
from db.common import UNSETTLED_CHUNK_STATES, utcnow
from db.models import Chunk, Job, Worker
from db.session import session_scope
from jobs.planner import LaneStats, LiveLanes

STATS_KEY = "laneway:lane_stats"
STATS_WINDOW = timedelta(hours=24)
# Fewer items than this on a lane is no measurement: the threshold decides meanwhile.
MIN_MEASURED_ITEMS = 500
COLD_STARTS_AVERAGED = 10


def alive_workers(
    settings: Settings, lane: str | None = None, since: datetime | None = None
) -> list[Worker]:
    """Worker processes beating now, or heard from since `since` (optionally: those
    consuming `lane`), detached from their session."""
    with session_scope(settings) as session:
        workers = common.alive_workers(session, settings.worker_dead_after, lane, since)
        session.expunge_all()
    return workers


# --- measured lanes --------------------------------------------------------------------


def lane_totals(settings: Settings) -> dict[str, dict[str, Any]]:
    """Per lane, over the last day's finished range chunks: items, stage seconds, the same
    seconds times the cores their workers held (`core_seconds`, what they are priced at),
    and the device the gpu lane's model stage ran on."""
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
                func.sum(
                    (
                        func.coalesce(Chunk.pre_seconds, 0.0)
                        + func.coalesce(Chunk.model_seconds, 0.0)
                        + func.coalesce(Chunk.post_seconds, 0.0)
                    )
                    * func.coalesce(Chunk.cpu_cores, 1)
                ),
            )
            .where(Chunk.state == "done", Chunk.positions.is_(None), Chunk.finished_at >= since)
            .group_by(Chunk.queue, Chunk.device)
        ).all()
    lanes: dict[str, dict[str, Any]] = {}
    for queue, device, n, pre, model, post, core_seconds in rows:
        lane = lanes.setdefault(
            queue,
            {
                "items": 0,
                "pre": 0.0,
                "model": 0.0,
                "post": 0.0,
                "core_seconds": 0.0,
                "device": "cpu",
            },
        )
        lane["items"] += n or 0
        lane["pre"] += pre
        lane["model"] += model
        lane["post"] += post
        lane["core_seconds"] += core_seconds or 0.0
        if device == "cuda":
            lane["device"] = "cuda"
    return lanes


# How many of a lane's latest chunks its measured speed reads (jobs/planner.chunk_size_for),
# among how many of the newest chunks of every lane: a submission's look costs at most that
# many index entries however large the table (a lane idle for days has none among them and
# is unmeasured, its jobs cut at LANEWAY_CHUNK_SIZE).
RECENT_CHUNKS = 64
SCANNED_CHUNKS = 20_000


def worker_speed(session: Session, lane: str, tasks: list[str]) -> float | None:
    """Items per second one worker of `lane` computed (`worker_rate`) on its latest finished
    range chunks of jobs with these `tasks` (at most RECENT_CHUNKS, within the day); None
    under MIN_MEASURED_ITEMS items. Read on the caller's transaction; the latest chunks by
    id come off the primary key's index, among the SCANNED_CHUNKS newest."""
    rows = session.execute(
        select(
            Chunk.stop - Chunk.start,
            func.coalesce(Chunk.pre_seconds, 0.0),
            func.coalesce(Chunk.model_seconds, 0.0),
            func.coalesce(Chunk.post_seconds, 0.0),
            Job.tasks,
        )
        .join(Job, Job.id == Chunk.job_id)
        .where(
            Chunk.id > select(func.max(Chunk.id)).scalar_subquery() - SCANNED_CHUNKS,
            Chunk.queue == lane,
            Chunk.state == "done",
            Chunk.positions.is_(None),
            Chunk.finished_at >= utcnow() - STATS_WINDOW,
        )
        .order_by(Chunk.id.desc())
        .limit(RECENT_CHUNKS)
    ).all()
    # A chunk the result cache answered whole ran no stage: it says nothing of the speed.
    mine = [r[:4] for r in rows if list(r[4]) == list(tasks) and worker_rate(lane, *r[:4])]
    items = sum(r[0] for r in mine)
    if items < MIN_MEASURED_ITEMS:
        return None
    return worker_rate(lane, items, *(sum(r[i] for r in mine) for i in (1, 2, 3)))


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


def worker_rate(lane: str, items: float, pre: float, model: float, post: float) -> float | None:
    """Items per second of one worker of `lane` from its chunks' stage seconds: the gpu
    lane's model stage alone (its worker holds a chunk for that stage only), the cpu lane's
    three stages; None when they took no time."""
    seconds = model if lane == "gpu" else pre + model + post
    return items / seconds if seconds > 0 else None


def cpu_cores(lane: dict[str, Any]) -> float:
    """The cores a lane's workers held, over its measured seconds (1 where none was
    recorded)."""
    spent = lane["pre"] + lane["model"] + lane["post"]
    return lane.get("core_seconds", spent) / spent if spent > 0 else 1.0


def stats_from(lanes: dict[str, dict[str, Any]], cold_starts: list[float]) -> LaneStats | None:
    """The measured lanes, or None until both have run MIN_MEASURED_ITEMS items."""
    cpu, gpu = lanes.get("cpu"), lanes.get("gpu")
    if not cpu or not gpu or min(cpu["items"], gpu["items"]) < MIN_MEASURED_ITEMS:
        return None
    cpu_rate = worker_rate("cpu", cpu["items"], cpu["pre"], cpu["model"], cpu["post"])
    gpu_rate = worker_rate("gpu", gpu["items"], gpu["pre"], gpu["model"], gpu["post"])
    if cpu_rate is None or gpu_rate is None:
        return None
    return LaneStats(
        cpu_items_per_second=round(cpu_rate, 3),
        cpu_seconds_per_item=1 / cpu_rate,
        cpu_cores=cpu_cores(cpu),
        gpu_items_per_second=round(gpu_rate, 3),
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


FLEET_KEY = "laneway:fleet:{host}"


def publish_fleet(r: redis.Redis, host: str, gpu_devices: int, ttl: int = 30) -> None:
    """A fleet supervisor tells routing how many gpu devices it can start workers on."""
    r.set(FLEET_KEY.format(host=host), json.dumps({"gpu_devices": gpu_devices}), ex=ttl)


def withdraw_fleet(r: redis.Redis, host: str) -> None:
    """A stopped fleet supervisor takes its report back."""
    r.delete(FLEET_KEY.format(host=host))


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


def live_lanes(settings: Settings, session: Session) -> LiveLanes:
    """Workers up now and each lane's work not yet done (its chunks in flight and those
    waiting for a slot, from Postgres: the broker holds only a lane's window). Read on
    `session`, the caller's open transaction: a second connection from the same pool,
    taken while the first is held, deadlocks the pool once as many callers do it at once as
    it has connections (a burst of fallback jobs would wait out the pool's timeout)."""
    workers = common.alive_workers(session, settings.worker_dead_after)
    backlog = dict(
        session.execute(
            select(Chunk.queue, func.sum(Chunk.stop - Chunk.start))
            .where(Chunk.state.in_(UNSETTLED_CHUNK_STATES))
            .group_by(Chunk.queue)
        ).all()
    )
    return LiveLanes(
        cpu_workers=sum("cpu" in w.queues for w in workers),
        gpu_workers_up=sum("gpu" in w.queues for w in workers),
        gpu_devices=fleet_gpu_devices(settings),
        cpu_backlog_items=int(backlog.get("cpu") or 0),
        gpu_backlog_items=int(backlog.get("gpu") or 0),
    )
