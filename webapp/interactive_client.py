"""The web half of the interactive path: which lane a request goes to, the message that
carries it (shared by the requests a process sends at the same moment) and the Redis
client its thread waits on. The protocol itself is laneway/interactive_protocol.py.

Each object here is kept per process (and per app's settings): a gunicorn worker's
threads share them, a forked process makes its own.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import redis
from celery import Celery

from jobs.lanes import alive_workers
from laneway.interactive_protocol import TASK_NAME, Request
from laneway.redis_conn import client_url
from laneway.settings import Settings

log = logging.getLogger(__name__)

_clients: dict[tuple[int, str], redis.Redis] = {}
_clients_lock = threading.Lock()


def blocking_client(settings: Settings) -> redis.Redis:
    """A Redis client per process whose reads may block as long as the longest wait."""
    key = (os.getpid(), settings.redis_url)
    with _clients_lock:
        if key not in _clients:
            _clients[key] = redis.Redis.from_url(
                client_url(settings.redis_url),
                socket_timeout=max(settings.sync_max_wait, settings.sync_timeout) + 10,
            )
        return _clients[key]


def send_message(
    celery: Celery, requests: Sequence[Request], lane: str, expires: float | None
) -> None:
    """One message on the lane's interactive queue, carrying one or more requests."""
    celery.send_task(
        TASK_NAME,
        args=[[r.message() for r in requests]],
        queue=f"interactive.{lane}",
        expires=expires,
        ignore_result=True,
        # What Flower and the worker's log show of the message: how many requests, never
        # their texts (customers' data), and no saferepr of every text on each send.
        argsrepr=f"({len(requests)} interactive requests)",
        kwargsrepr="{}",
    )


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
    since (a worker killed without a word stays registered until its heartbeats lapse)."""

    def __init__(
        self,
        served_since: Callable[[datetime], bool],
        dead_after: float,
        refresh: float = 2.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.served_since = served_since
        self.dead_after = timedelta(seconds=dead_after)
        self.refresh = timedelta(seconds=refresh)
        self.clock = clock
        self.lock = threading.Lock()
        self.read_at: datetime | None = None
        self.missed_at: datetime | None = None
        self.live = False

    def gpu_live(self) -> bool:
        now = self.clock()
        with self.lock:
            if self.read_at is not None and now - self.read_at < self.refresh:
                return self.live
            self.read_at = now
            since = now - self.dead_after
            if self.missed_at is not None:
                since = max(since, self.missed_at)
        try:
            live = self.served_since(since)
        except Exception as exc:  # noqa: BLE001 - the cpu lane still answers
            log.warning("could not read the interactive workers: %s", type(exc).__name__)
            live = False
        with self.lock:
            self.live = live
        return live

    def missed(self) -> None:
        with self.lock:
            self.missed_at = self.clock()
            self.live, self.read_at = False, None


_choosers: dict[tuple[int, str], LaneChooser] = {}


def chooser(settings: Settings) -> LaneChooser:
    """This process's lane chooser for the worker registry `settings` name (an app made with
    other settings in the same process, a test's above all, never reads another's)."""
    key = (os.getpid(), settings.database_url)
    with _clients_lock:
        if key not in _choosers:

            def served_since(since: datetime) -> bool:
                return bool(alive_workers(settings, "interactive.gpu", since))

            _choosers[key] = LaneChooser(served_since, settings.worker_dead_after)
        return _choosers[key]


def lane_for(settings: Settings) -> str:
    """The lane this process sends its next interactive request to."""
    setting = settings.interactive_lane
    # A pinned lane needs no look at the worker registry.
    return choose_lane(setting, setting == "auto" and chooser(settings).gpu_live())


def missed(settings: Settings, lane: str) -> None:
    """A request sent to `lane` was not answered in time."""
    if lane == "gpu" and settings.interactive_lane == "auto":
        chooser(settings).missed()


class Coalescer:
    """Concurrent requests of one web process share a message: the thread that finds no
    send under way sends what is pending, and goes on while more arrived meanwhile. A lone
    request is sent at once; under load one message carries many requests, so the broker
    and the worker pay their per-message cost once for all of them."""

    def __init__(self, sender: Callable[[list[Request], float | None], None]) -> None:
        self.sender = sender
        self.lock = threading.Lock()
        self.pending: list[tuple[Request, float | None]] = []
        self.sending = False
        self.messages = 0

    def send(self, request: Request, expires: float | None) -> None:
        with self.lock:
            self.pending.append((request, expires))
            if self.sending:
                return  # the sending thread takes it with the next message
            self.sending = True
        failed: BaseException | None = None
        while True:
            with self.lock:
                batch, self.pending = self.pending, []
                if not batch:
                    self.sending = False
                    break
            waits = [e for _, e in batch]
            longest = None if None in waits else max(w for w in waits if w is not None)
            self.messages += 1
            try:
                self.sender([r for r, _ in batch], longest)
            except Exception as exc:  # noqa: BLE001 - what is pending still gets its turn
                failed = failed or exc
        if failed is not None:
            # The requests of a message that did not go are never answered: their callers'
            # waits end and store them as jobs; this caller learns it at once.
            raise failed


_coalescers: dict[tuple[int, str, int], Coalescer] = {}


def send(request: Request, celery: Celery, lane: str, expires: float | None = None) -> None:
    """Send a request to the lane's interactive workers through the app's Celery, in a
    message shared with the requests this process sends there at the same moment. A
    request whose message failed to go is never answered: its caller's wait ends and
    stores it as a job."""
    key = (os.getpid(), lane, id(celery))
    with _clients_lock:
        if key not in _coalescers:
            _coalescers[key] = Coalescer(lambda batch, exp: send_message(celery, batch, lane, exp))
        coalescer = _coalescers[key]
    coalescer.send(request, expires)


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
