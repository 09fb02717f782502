"""The web half of the interactive path: which lane a request goes to, and the Redis client
that queues it and waits for its answer. The protocol itself is core/store/interactive_protocol.py.

Each object here is kept per process (and per app's settings): a gunicorn worker's
threads share them, a forked process makes its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import redis

from core.config.settings import Settings
from core.store.interactive_protocol import Request, push
from core.store.interactive_protocol import send_and_wait as send_and_wait_answer
from core.store.redis_conn import client_url
from core.util import process
from jobs.lanes import alive_workers
from webapp import ratelimit_gate
from webapp.refresh_ahead import read_ahead

log = logging.getLogger(__name__)

_clients: dict[tuple[int, str], redis.Redis] = {}
_clients_lock = threading.Lock()
T = TypeVar("T")


def _per_process(
    made: dict[tuple[int, str], T], name: str, make: Callable[[Settings], T], settings: Settings
) -> T:
    """This process's one `made[name]`, made by `make(settings)` on first use: looked up
    without the lock (and without making a closure) on every request's way, made under the
    lock once."""
    key = (process.pid(), name)
    found = made.get(key)
    if found is not None:
        return found
    with _clients_lock:
        if key not in made:
            made[key] = make(settings)
        return made[key]


def _blocking_client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(
        client_url(settings.redis_url),
        socket_timeout=max(settings.sync_max_wait, settings.sync_timeout) + 10,
    )


def blocking_client(settings: Settings) -> redis.Redis:
    """A Redis client per process whose reads may block as long as the longest wait."""
    return _per_process(_clients, settings.redis_url, _blocking_client, settings)


def choose_lane(setting: str, gpu_live: bool) -> str:
    """The lane an interactive request goes to: LANEWAY_INTERACTIVE_LANE, or for `auto`
    the gpu lane while an interactive gpu worker is live (a GPU runs a small batch in a few
    milliseconds, and the CPU stays free for the web app), else the cpu lane."""
    if setting != "auto":
        return setting
    return "gpu" if gpu_live else "cpu"


class LaneChooser:
    """Per web process: whether an interactive gpu worker is live, from the worker registry
    (Postgres heartbeats), read at most every `refresh` seconds. A request the gpu lane did
    not answer in time marks it missed: it is trusted again only once a worker has beaten
    since (a worker killed without a word stays registered until its heartbeats lapse).
    With `ahead` (a pool's submit), a read that is due runs there while requests go on with
    the last answer, so none waits on Postgres; the first read, and the first after a
    miss, are made inline."""

    def __init__(
        self,
        served_since: Callable[[datetime], bool],
        dead_after: float,
        refresh: float = 2.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        ahead: Callable[[Callable[[], None]], Any] | None = None,
    ) -> None:
        self.served_since = served_since
        self.dead_after = timedelta(seconds=dead_after)
        self.refresh = timedelta(seconds=refresh)
        self.clock = clock
        self.ahead = ahead
        self.lock = threading.Lock()
        self.read_at: datetime | None = None
        self.missed_at: datetime | None = None
        self.live = False
        self.misses = 0  # a read begun before the latest miss is not believed

    def gpu_live(self) -> bool:
        now = self.clock()
        with self.lock:
            if self.read_at is not None and now - self.read_at < self.refresh:
                return self.live
            background = self.ahead is not None and self.read_at is not None
            self.read_at = now
            since = now - self.dead_after
            if self.missed_at is not None:
                since = max(since, self.missed_at)
            misses, live = self.misses, self.live
        if background:
            try:
                self.ahead(lambda: self._read(since, misses))  # type: ignore[misc]
                return live
            except RuntimeError:  # the pool is shut down: read here
                pass
        return self._read(since, misses)

    def _read(self, since: datetime, misses: int) -> bool:
        try:
            live = self.served_since(since)
        except Exception as exc:  # noqa: BLE001 - the cpu lane still answers
            log.warning("could not read the interactive workers: %s", type(exc).__name__)
            live = False
        with self.lock:
            if misses == self.misses:
                self.live = live
            return self.live

    def missed(self) -> None:
        with self.lock:
            self.missed_at = self.clock()
            self.live, self.read_at = False, None
            self.misses += 1


_choosers: dict[tuple[int, str], LaneChooser] = {}


def _chooser(settings: Settings) -> LaneChooser:
    def served_since(since: datetime) -> bool:
        return bool(alive_workers(settings, "interactive.gpu", since))

    return LaneChooser(served_since, settings.worker_dead_after, ahead=read_ahead)


def chooser(settings: Settings) -> LaneChooser:
    """This process's lane chooser for the worker registry `settings` name (an app made with
    other settings in the same process, a test's above all, never reads another's)."""
    return _per_process(_choosers, settings.database_url, _chooser, settings)


def lane_for(settings: Settings) -> str:
    """The lane this process sends its next interactive request to."""
    setting = settings.interactive_lane
    # A pinned lane needs no look at the worker registry.
    return choose_lane(setting, setting == "auto" and chooser(settings).gpu_live())


def missed(settings: Settings, lane: str) -> None:
    """A request sent to `lane` was not answered in time."""
    if lane == "gpu" and settings.interactive_lane == "auto":
        chooser(settings).missed()


def send_and_wait(
    settings: Settings,
    request: Request,
    lane: str,
    wait: float,
    gate: ratelimit_gate.Gate | None = None,
) -> dict | None:
    """Queue a request for the lane's interactive workers and wait up to `wait` seconds for
    its answer (one round trip, the caller's rate limit counted in it when it is gated:
    webapp/ratelimit_gate.py); None when none came, or Redis is away (its caller then
    stores the request as a job). RateLimitExceeded when the limit refused it (in a
    request; outside one, None and `gate.refused`). `gate`: this request's, if not in g."""
    gate = gate or ratelimit_gate.pending()
    try:
        return send_and_wait_answer(blocking_client(settings), request, lane, wait, gate)
    except (redis.RedisError, OSError) as exc:
        log.warning("the interactive path is unavailable: %s", type(exc).__name__)
        return None


def send(settings: Settings, requests: Sequence[Request], lane: str) -> None:
    """Queue requests for the lane's interactive workers, without waiting."""
    with blocking_client(settings).pipeline(transaction=False) as pipe:
        push(pipe, lane, requests)
        pipe.execute()


def parse_prefer_wait(header: str | None) -> float | None:
    """`Prefer: wait=N` (RFC 7240): N seconds, or None when absent or unreadable (a
    preference the server cannot read is ignored, as the RFC says)."""
    for part in (header or "").split(","):
        for pref in part.split(";"):
            name, _, value = pref.strip().partition("=")
            if name.strip().lower() != "wait":
                continue
            value = value.strip().strip('"')
            if value.isdigit() and len(value) < 10:
                return float(value)
    return None
