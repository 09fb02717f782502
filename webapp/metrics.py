"""What a Prometheus scrape of /metrics gets: every Laneway process's counters on this
machine (core/obs/metrics.py), the queues' depth read from the broker, and the fleet's
health where every deployment keeps it: Postgres (live workers by queue, open dead
letters) and Redis (core/store/fleet_metrics.py: when beat last ticked and the reconciler
last finished, and the thresholds the webhook alerts use).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from core.config.settings import Settings
from core.obs import metrics

# From core.obs.metrics, which picks the multiprocess folder before prometheus_client loads.
from core.obs.metrics import (
    CollectorRegistry,
    CompactingCollector,
    GaugeMetricFamily,
    generate_latest,
    queue_families,
)
from core.queueing.broker import queue_depths
from core.queueing.celery_app import QUEUES
from core.store.fleet_metrics import mark_families, setting_families
from core.store.redis_conn import redis_client
from db.models import DeadLetter
from db.session import session_scope
from jobs.lanes import alive_workers

log = logging.getLogger(__name__)


class QueueCollector:
    """The broker's queues, read at scrape time (a gauge file would go stale)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from queue_families(queue_depths(self.settings))


def database_families(settings: Settings, queues: tuple[str, ...]) -> list[GaugeMetricFamily]:
    """Live worker processes by queue (0 for a queue none consumes) and open dead letters."""
    workers = GaugeMetricFamily(
        "laneway_workers_alive",
        "Worker processes beating now, by queue they consume",
        labels=["queue"],
    )
    counts = dict.fromkeys(queues, 0)
    for worker in alive_workers(settings):
        for queue in worker.queues:
            counts[queue] = counts.get(queue, 0) + 1
    for queue, n in counts.items():
        workers.add_metric([queue], n)
    with session_scope(settings) as session:
        open_letters = session.scalar(
            select(func.count()).select_from(DeadLetter).where(DeadLetter.retried_at.is_(None))
        )
    letters = GaugeMetricFamily(
        "laneway_dead_letters_open",
        "Dead letters not sent back (laneway dlq list)",
        value=open_letters or 0,
    )
    return [workers, letters]


class FleetCollector:
    """The families above at each scrape. Without Postgres the workers and dead letters
    are left out (and logged) rather than the whole scrape failing."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from setting_families(self.settings)
        yield from mark_families(redis_client(self.settings))
        try:
            families = database_families(self.settings, QUEUES)
        except SQLAlchemyError as exc:
            log.warning("/metrics without the database's figures: %s", type(exc).__name__)
            return
        yield from families


def exposition(settings: Settings) -> bytes:
    """The text a Prometheus scrape gets: every process's metrics on this machine, the
    queues' depth and the fleet's health."""
    registry = CollectorRegistry()
    registry.register(QueueCollector(settings))
    registry.register(FleetCollector(settings))
    if metrics.DIR is not None:
        CompactingCollector(registry, path=str(metrics.DIR))
    return generate_latest(registry)
