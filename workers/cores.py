"""Batch workers share their host's cores with its interactive worker.

A cpu-lane batch worker runs its model on every core while its host has no interactive work
(`CoreShare`): keeping a core back for interactive traffic that is not there would leave it
idle through a whole batch job. An interactive worker marks its host busy in Redis on each
message it receives (`BusyMark`: a key per host that expires `HOLD` seconds after the last
request), and before each micro-batch the batch worker looks at the mark once: while it
stands the batch steps aside (`StepAside`: it waits, at most `LANEWAY_BATCH_YIELD_MAX`
seconds each time, so a steady stream of interactive requests slows a batch job without
stopping it) and runs with one torch thread fewer, giving the interactive worker a core
back; once the mark lapses it takes every core again. Changing torch's thread count between
forwards costs microseconds. Hosts are told apart by host name: workers on other machines
(or other pods) never wait for this one's traffic.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping

import redis

# How long an idle OpenMP thread spins before it sleeps, in libgomp's spins (about 100,000
# a millisecond): ~0.3 ms bridges the gaps between one forward's operations (sleeping
# through each, OMP_WAIT_POLICY=PASSIVE, slows batch work) and is too short to burn a core
# that another process needs for long. libgomp's own default spins ~3 ms, PASSIVE not at all.
OPENMP_SPIN_COUNT = "30000"
OPENMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def openmp_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The OpenMP wait settings a worker runs with: a short spin, then sleep. An operator's
    own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins (when both are set, libgomp obeys
    GOMP_SPINCOUNT). Read by libgomp once, when torch loads it: set before that."""
    environ = os.environ if environ is None else environ
    own = {name: environ[name] for name in OPENMP_VARIABLES if environ.get(name)}
    # PASSIVE too, for OpenMP runtimes that know no GOMP_SPINCOUNT (Intel's, LLVM's).
    return own or {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": OPENMP_SPIN_COUNT}


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


def mark_left_ms(r: redis.Redis, key: str) -> int:
    """Milliseconds the busy mark `key` has left; 0 when there is none (or Redis is away)."""
    try:
        return max(0, int(r.pttl(key)))  # -2: no mark; -1: no expiry (not ours)
    except redis.RedisError:
        return 0


class StepAside:
    """The batch side, called before each micro-batch: waits while this host is marked
    busy, at most `max_pause` seconds per call (0: never); `paused` adds up the seconds
    waited (the model stage's time, and so its cost, leaves them out) and `busy` says
    whether the mark still stood at the last look."""

    def __init__(
        self,
        r: redis.Redis | None,
        max_pause: float,
        host: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        look: Callable[[], int] | None = None,
    ) -> None:
        self.max_pause, self.clock, self.sleep = max_pause, clock, sleep
        key = busy_key(host)
        self.look = look or (lambda: mark_left_ms(r, key))
        self.paused = 0.0
        self.busy = False

    def __call__(self, left_ms: int | None = None) -> float:
        """Wait out the mark; `left_ms`, when the caller read it already, saves a look."""
        started = self.clock()
        deadline, slept = started + self.max_pause, False
        while True:
            if left_ms is None:
                left_ms = self.look()
            now = self.clock()
            if left_ms <= 0 or now >= deadline:
                break
            # The mark's expiry is the earliest the batch can go on; a fresh request
            # renews it, and the next look sees that.
            self.sleep(min(left_ms / 1000, deadline - now))
            slept, left_ms = True, None
        self.busy = left_ms > 0
        waited = self.clock() - started if slept else 0.0
        self.paused += waited
        return waited


def _set_torch_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def host_batch_workers(torch_threads: int, cores: int | None = None) -> int:
    """How many batch workers of `torch_threads` threads this host's cores hold, as
    `laneway fleet` shares them (LANEWAY_CPU_WORKERS): each of n waits n times
    LANEWAY_BATCH_YIELD_MAX while the host is busy, so a steady interactive stream leaves
    the host's batch side as a whole the same share of the cores whatever its count."""
    from core.config.host import usable_cores

    cores = usable_cores() if cores is None else cores
    return max(1, cores // max(1, torch_threads))


class CoreShare:
    """The batch side's torch threads, set before each micro-batch: `cores` while the host
    has no interactive work, one fewer (never under 1) while it has; a change only when the
    count must change. `changes` counts them (the chunk's log line reports it)."""

    def __init__(
        self,
        cores: int,
        set_threads: Callable[[int], None] = _set_torch_threads,
        threads: int | None = None,
    ) -> None:
        self.cores = max(1, cores)
        self.set_threads = set_threads
        self.threads = _torch_threads() if threads is None else threads
        self.changes = 0

    def want(self, busy: bool) -> int:
        return max(1, self.cores - 1) if busy else self.cores

    def __call__(self, busy: bool) -> int:
        n = self.want(busy)
        if n != self.threads:
            self.set_threads(n)
            self.threads = n
            self.changes += 1
        return n
