"""What a Prometheus scrape of /metrics gets: every Laneway process's counters on this
machine (core/obs/metrics.py), the queues' depth read from the broker, and the fleet's
health where every deployment keeps it: Postgres (live workers by queue, open dead
letters, each lane's window and its share by account type) and Redis
(core/store/fleet_metrics.py: when beat last ticked and the reconciler last finished, and
the thresholds the webhook alerts use).
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
from core.vocab import ACCOUNT_TYPES
from db.models import DeadLetter
from db.session import session_scope
from jobs.lanes import alive_workers
from webapp.jobviews import lane_shares

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


def lane_families(settings: Settings) -> list[GaugeMetricFamily]:
    """Each lane's fair share (jobs/fairshare.py) by account type, never by account: the
    type's share of the lane by weight among the accounts with work there, its items in
    flight and waiting; and the lane's window. Every type has a sample on every lane (0
    where none of its accounts has work), so a series does not vanish when a type idles."""
    labels = ["lane", "account_type"]
    share = GaugeMetricFamily(
        "laneway_lane_share",
        "A type's share of the lane: its weights over all weights with work on the lane",
        labels=labels,
    )
    flying = GaugeMetricFamily(
        "laneway_lane_in_flight_items", "Items in flight on the lane, by type", labels=labels
    )
    waiting = GaugeMetricFamily(
        "laneway_lane_waiting_items", "Items waiting for a slot on the lane, by type", labels=labels
    )
    window = GaugeMetricFamily(
        "laneway_lane_window", "Chunks the lane keeps in flight", labels=["lane"]
    )
    with session_scope(settings) as session:
        lanes = lane_shares(session, settings)
    for lane in lanes:
        window.add_metric([lane["lane"]], lane["window"])
        types = lane["types"]
        for kind in (*ACCOUNT_TYPES, *sorted(set(types) - set(ACCOUNT_TYPES))):
            row = types.get(kind, {})
            share.add_metric([lane["lane"], kind], row.get("share", 0.0))
            flying.add_metric([lane["lane"], kind], row.get("in_flight_items", 0))
            waiting.add_metric([lane["lane"], kind], row.get("waiting_items", 0))
    return [share, flying, waiting, window]


class FleetCollector:
    """The families above at each scrape. Without Postgres the workers, dead letters and
    lanes are left out (and logged) rather than the whole scrape failing."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from setting_families(self.settings)
        yield from mark_families(redis_client(self.settings))
        try:
            families = database_families(self.settings, QUEUES) + lane_families(self.settings)
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
