"""Beat's scheduler: celery's persistent one, with a heartbeat that health checks read.

Beat answers no ping, and a check that only looks for its process cannot tell a beat whose
loop is stuck from one that sends its schedule. This one touches a file under LANEWAY_HOME
on every tick and ticks at least every BEAT_TICK_SECONDS; `laneway probe beat` fails when
that file has grown old (tasks/app.py makes it the app's beat_scheduler).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.beat import PersistentScheduler

from laneway.fleet_metrics import mark
from laneway.probes import BEAT_TICK_SECONDS, beat_heartbeat
from laneway.settings import get_settings

log = logging.getLogger(__name__)
# Beat's tick in Redis (for /metrics and the stalled-beat alert) at most this often.
MARK_EVERY = 5.0


class HeartbeatScheduler(PersistentScheduler):
    # Without entries due sooner, celery beat sleeps up to 5 minutes between ticks.
    max_interval = BEAT_TICK_SECONDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.settings = get_settings()
        self.heartbeat = beat_heartbeat(self.settings)
        self._warned = False
        self._marked = 0.0
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        interval = super().tick(*args, **kwargs)
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
