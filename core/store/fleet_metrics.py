"""What the alert rules need beyond the processes' own counters: the marks beat and the
reconciler leave in Redis, and the thresholds (the rest is read by webapp/metrics.py).

A process's counters reach /metrics only through a shared metrics folder (one machine, or
compose's shared home volume); a Kubernetes web pod never sees the workers'. The fleet's
health is read where every deployment keeps it: Postgres (live workers by queue, open dead
letters) and Redis (when beat last ticked and the reconciler last finished, written by
them through `mark`). The thresholds the webhook alerts use are exported too, so the
Prometheus rules alert where the webhook would (deploy/monitoring/prometheus/rules.yml).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import redis

from core.config.settings import Settings

# From core.obs.metrics, which picks the multiprocess folder before prometheus_client loads.
from core.obs.metrics import GaugeMetricFamily
from core.store.redis_conn import redis_client

log = logging.getLogger(__name__)

# Beat's scheduler (tasks/beat.py) ticks at least this often and touches its heartbeat file
# on every tick; a heartbeat older than BEAT_MAX_AGE means its loop has stopped.
BEAT_TICK_SECONDS = 15
BEAT_MAX_AGE = 4 * BEAT_TICK_SECONDS


def beat_heartbeat(settings: Settings) -> Path:
    return settings.home / "beat-heartbeat"


# What `mark` records, and the gauge each becomes.
MARKS = {
    "beat": ("laneway_beat_last_tick_timestamp_seconds", "Unix time beat last ticked"),
    "reconcile": (
        "laneway_reconcile_last_run_timestamp_seconds",
        "Unix time the reconciler last finished a pass",
    ),
}


def mark_key(what: str) -> str:
    return f"laneway:mark:{what}"


def mark(what: str, settings: Settings, now: float | None = None) -> bool:
    """Record that `what` (a MARKS key) happened now; False when Redis did not take it
    (the caller goes on: a missing mark only makes the stalled alert fire)."""
    try:
        redis_client(settings).set(mark_key(what), repr(time.time() if now is None else now))
    except redis.RedisError as exc:
        log.warning("could not record %s's mark: %s", what, type(exc).__name__)
        return False
    return True


def mark_families(client: redis.Redis) -> list[GaugeMetricFamily]:
    """Each mark's time; 0 for one never recorded (a beat that never ticked is stalled)."""
    names = list(MARKS)
    values = client.mget([mark_key(n) for n in names])
    families = []
    for what, raw in zip(names, values, strict=True):
        name, doc = MARKS[what]
        try:
            value = float(raw) if raw is not None else 0.0
        except ValueError:
            value = 0.0
        families.append(GaugeMetricFamily(name, doc, value=value))
    return families


def setting_families(settings: Settings) -> list[GaugeMetricFamily]:
    """The settings the webhook alerts compare against, for the rules to do the same."""
    return [
        GaugeMetricFamily(
            "laneway_alert_depth",
            "LANEWAY_ALERT_DEPTH: a lane deeper than this alerts",
            value=settings.alert_depth,
        ),
        GaugeMetricFamily(
            "laneway_reconcile_interval_seconds",
            "LANEWAY_RECONCILE_INTERVAL: seconds between reconciler passes",
            value=settings.reconcile_interval,
        ),
    ]
