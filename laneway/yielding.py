"""Batch workers step aside while an interactive worker on the same host is busy.

Niceness and one torch thread fewer (tasks/app.py) leave a batch worker running beside
interactive work on a shared CPU; on a 2-core machine that co-running alone costs
interactive requests more than their goal (docs/benchmarks.md). So an interactive worker
marks its host busy in Redis on each message it receives (`BusyMark`: a key per host
that expires `HOLD` seconds after the last request), and a batch worker on the same host
asks before each micro-batch (`StepAside`) and waits while the mark stands, at most
`LANEWAY_BATCH_YIELD_MAX` seconds each time, so a steady stream of interactive requests
slows a batch job without stopping it. Hosts are told apart by host name: workers on
other machines (or other pods) never wait for this one's traffic.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import redis

# How long a host counts as busy after its interactive worker's last request: longer than
# the gaps between requests of a client waiting for each answer, short enough that the
# batch job resumes soon after the traffic stops.
HOLD = 0.3


def busy_key(host: str | None = None) -> str:
    return f"laneway:interactive-busy:{host or socket.gethostname()}"


class BusyMark:
    """The interactive side: `mark()` on each message keeps this host marked busy for HOLD
    seconds; it writes to Redis at most every HOLD / 4 (the mark never lapses mid-stream)."""

    def __init__(
        self,
        r: redis.Redis,
        hold: float = HOLD,
        host: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis, self.hold, self.key, self.clock = r, hold, busy_key(host), clock
        self.next_write = 0.0

    def mark(self) -> None:
        now = self.clock()
        if now < self.next_write:
            return
        self.next_write = now + self.hold / 4
        try:
            self.redis.set(self.key, "1", px=max(1, int(self.hold * 1000)))
        except redis.RedisError:
            self.next_write = 0.0  # no mark this time: batch work simply goes on


class StepAside:
    """The batch side, called before each micro-batch: waits while this host is marked
    busy, at most `max_pause` seconds per call; `paused` adds up the seconds waited (the
    model stage's time, and so its cost, leaves them out)."""

    def __init__(
        self,
        r: redis.Redis,
        max_pause: float,
        host: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.redis, self.max_pause, self.key = r, max_pause, busy_key(host)
        self.clock, self.sleep = clock, sleep
        self.paused = 0.0

    def __call__(self) -> float:
        started = self.clock()
        deadline, slept = started + self.max_pause, False
        while True:
            try:
                left_ms = self.redis.pttl(self.key)  # -2: no mark; -1: no expiry (not ours)
            except redis.RedisError:
                break
            now = self.clock()
            if left_ms <= 0 or now >= deadline:
                break
            # The mark's expiry is the earliest the batch can go on; a fresh request
            # renews it, and the next look sees that.
            self.sleep(min(left_ms / 1000, deadline - now))
            slept = True
        waited = self.clock() - started if slept else 0.0
        self.paused += waited
        return waited
