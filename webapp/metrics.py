"""What a Prometheus scrape of /metrics gets: every Laneway process's counters on this
machine (laneway/metrics.py), the queues' depth read from the broker, and the fleet's
health where every deployment keeps it: Postgres (live workers by queue, open dead
letters) and Redis (laneway/fleet_metrics.py: when beat last ticked and the reconciler
last finished, and the thresholds the webhook alerts use).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from db.models import DeadLetter
from db.session import session_scope
from jobs.lanes import alive_workers
from laneway import metrics
from laneway.celery_app import QUEUES
from laneway.fleet_metrics import mark_families, setting_families

# From laneway.metrics, which picks the multiprocess folder before prometheus_client loads.
from laneway.metrics import (
    CollectorRegistry,
    FolderCollector,
    GaugeMetricFamily,
    QueueCollector,
    compact,
    generate_latest,
)
from laneway.redis_conn import redis_client
from laneway.settings import Settings

log = logging.getLogger(__name__)


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
    if metrics.DIR is None:
        return generate_latest(registry)
    FolderCollector(registry, path=str(metrics.DIR))
    with metrics.locked(metrics.DIR):
        compact(metrics.DIR)
        return generate_latest(registry)
