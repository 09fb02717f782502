"""Beat's scheduler: celery's persistent one, with a heartbeat that health checks read.

Beat answers no ping, and a check that only looks for its process cannot tell a beat whose
loop is stuck from one that sends its schedule. This one touches a file under LANEWAY_HOME
on every tick and ticks at least every BEAT_TICK_SECONDS; `laneway probe beat` fails when
that file has grown old (tasks/app.py makes it the app's beat_scheduler).

Each tick also looks for the broker's epoch key (core/queueing/broker.py): when Redis comes back
empty, the messages of every queued chunk are gone, and the reconciler is sent at once to
send them again, instead of on its next pass after their grace period.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.beat import PersistentScheduler

from core.queueing.broker import broker_emptied, mark_broker
from core.queueing.celery_app import app_settings
from core.store.fleet_metrics import BEAT_TICK_SECONDS, beat_heartbeat, mark
from core.store.redis_conn import redis_client

log = logging.getLogger(__name__)
# Beat's tick in Redis (for /metrics and the stalled-beat alert) at most this often.
MARK_EVERY = 5.0

# How often beat asks Redis whether it came back empty (one EXISTS): the lost chunks are
# re-sent within this, plus a worker's reconnect and one reconciler pass.
BROKER_CHECK_SECONDS = 2.0


class EmptiedBrokerWatch:
    """Sends the reconciler at once when Redis comes back empty (its epoch key gone)."""

    def __init__(self, app: Any, r: Any) -> None:
        self.app, self.redis = app, r
        self.away = False  # warned once per outage, not on every tick

    def check(self) -> bool:
        """True when Redis had lost its data and the reconciler was sent."""
        try:
            emptied = broker_emptied(self.redis)
            self.away = False
            if not emptied:
                return False
            noticed = time.time()
            log.warning("Redis came back empty: reconciling now to send lost chunks again")
            # Marked only once sent: should the send fail, the next tick tries again. A
            # second beat may send it too; two passes side by side are safe.
            self.app.send_task("laneway.reconcile", kwargs={"emptied_at": noticed})
            mark_broker(self.redis)
        except Exception as exc:  # noqa: BLE001 - Redis away: the next tick looks again
            if not self.away:
                log.warning("cannot check whether Redis was emptied: %s", type(exc).__name__)
            self.away = True
            return False
        return True


class HeartbeatScheduler(PersistentScheduler):
    # Without entries due sooner, celery beat sleeps up to 5 minutes between ticks.
    max_interval = min(BEAT_TICK_SECONDS, BROKER_CHECK_SECONDS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.settings = app_settings()
        self.heartbeat = beat_heartbeat(self.settings)
        self._warned = False
        self._marked = 0.0
        super().__init__(*args, **kwargs)
        self.broker_watch = EmptiedBrokerWatch(self.app, redis_client(self.settings))

    def tick(self, *args: Any, **kwargs: Any) -> float:
        interval = super().tick(*args, **kwargs)
        self.broker_watch.check()
        try:
            self.heartbeat.touch()
        except OSError as exc:
            # The schedule still runs; the health check reports the missing heartbeat.
            if not self._warned:
                log.warning("cannot touch the beat heartbeat %s: %s", self.heartbeat, exc)
                self._warned = True
        # The file is this machine's; the mark in Redis is what every web pod's /metrics sees.
        now = time.monotonic()
        if now - self._marked >= MARK_EVERY:
            self._marked = now
            mark("beat", self.settings)
        return interval
