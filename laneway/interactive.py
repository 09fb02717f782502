"""The interactive path, shared by the web app (which sends requests and waits for their
answers) and the interactive workers (which batch them and answer).

A request is a few items for a few tasks. It travels in one Celery message on its lane's
interactive queue (`interactive.cpu` or `interactive.gpu`), which batch chunks never use,
and carries its texts (it is small: at most LANEWAY_SYNC_MAX_ITEMS items). The answer comes
back through Redis, not the result backend: the worker pushes it onto a list the web
thread is blocked on (BLPOP, one hop), and for the asynchronous pair also keeps it under
the request's id for GET /v1/result/<id>. A request nobody answered in time becomes a
normal job in Postgres (the web app's 202), so nothing is lost.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from laneway import tracing
from laneway.redis_conn import client_url
from laneway.settings import Settings

log = logging.getLogger(__name__)
TASK_NAME = "laneway.interactive"
RESULT_TTL = 24 * 3600  # seconds an asynchronous result (and its owner) is kept
REPLY_TTL = 120  # seconds an unread synchronous answer is kept
PENDING, SUCCESS, FAILURE = "PENDING", "SUCCESS", "FAILURE"


def reply_key(request_id: str) -> str:
    return f"laneway:interactive:{request_id}:reply"


def result_key(request_id: str) -> str:
    return f"laneway:interactive:{request_id}:result"


def owner_key(request_id: str) -> str:
    return f"laneway:interactive:{request_id}:owner"


@dataclass
class Request:
    """One caller's request, as it travels to the worker (JSON)."""

    id: str
    tasks: list[str]
    labels: list[str]
    ids: list[str]
    texts: list[str]
    keep: bool = False  # the asynchronous pair: keep the answer for GET /v1/result
    sent: float = 0.0  # when the web app sent it (time.time()), for the stage timings
    account: int | None = None  # whose result cache entries it reads and fills (None: none)
    # The caller's span context (W3C headers) when tracing is on: requests share messages
    # and batches, so each carries its own (laneway/tracing.py).
    trace: dict[str, str] | None = None

    def message(self) -> dict[str, Any]:
        data = self.__dict__.copy()
        if data["trace"] is None:
            del data["trace"]  # off: the message is what a worker without tracing reads
        return data

    @classmethod
    def from_message(cls, data: dict[str, Any]) -> Request:
        return cls(**data)


def new_request(
    tasks: Sequence[str],
    labels: Sequence[str],
    items: Sequence[tuple[str, str]],
    keep: bool,
    account: int,
) -> Request:
    return Request(
        uuid.uuid4().hex,
        list(tasks),
        list(labels),
        [i for i, _ in items],
        [t for _, t in items],
        keep,
        time.time(),
        account,
        tracing.carrier(),
    )


def item_results(
    ids: Sequence[str], outputs: Sequence[dict[str, Any] | None], errors: Sequence[str | None]
) -> list[dict[str, Any]]:
    """One record per item, as the jobs' results: `{"id", ...fields}` or `{"id", "error"}`."""
    return [
        {"id": i, "error": e} if e is not None else {"id": i, **(o or {})}
        for i, o, e in zip(ids, outputs, errors, strict=True)
    ]


def answer(request: Request, results: list[dict[str, Any]] | None, error: str | None) -> dict:
    """The answer to a request: SUCCESS unless every item failed (or the request did)."""
    failed = error is not None or all("error" in r for r in results or [])
    body: dict[str, Any] = {"status": FAILURE if failed else SUCCESS, "output": results}
    if failed:
        body["error"] = error or (results[0]["error"] if results else "failed")
    return body


def server_timing(answer_body: dict[str, Any], waited: float, total: float) -> str:
    """A `Server-Timing` header: where a sync request's time went, in milliseconds (the
    worker's stages from its answer; `reply` is what the round trip added around them)."""
    t = answer_body.get("timing") or {}
    stages = [(k, t[k]) for k in ("broker", "batchwait", "run") if k in t]
    inside = sum(v for _, v in stages)
    stages += [("reply", max(0.0, waited * 1000 - inside)), ("view", total * 1000)]
    stages.append(("batch", t.get("batch_items", 0)))
    return ", ".join(f"{name};dur={value:.2f}" for name, value in stages)


def deliver(r: redis.Redis, answers: Sequence[tuple[Request, dict[str, Any]]]) -> None:
    """Hand each answer to whoever waits: the web thread's list, and for the asynchronous
    pair the result kept under the request's id; one round trip for them all."""
    pipe = r.pipeline(transaction=False)
    for request, body in answers:
        data = json.dumps(body, separators=(",", ":"))
        if request.keep:
            pipe.set(result_key(request.id), data, ex=RESULT_TTL)
        pipe.rpush(reply_key(request.id), data)
        pipe.expire(reply_key(request.id), REPLY_TTL)
    pipe.execute()


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
    requests: Sequence[Request], settings: Settings, lane: str, expires: float | None
) -> None:
    """One message on the lane's interactive queue, carrying one or more requests."""
    from tasks.app import app

    app.send_task(
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
                from tasks.scaling import alive_workers

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


_coalescers: dict[tuple[int, str], Coalescer] = {}


def send(request: Request, settings: Settings, lane: str, expires: float | None = None) -> None:
    """Send a request to the lane's interactive workers, in a message shared with the
    requests this process sends there at the same moment. A request whose message failed
    to go is never answered: its caller's wait ends and stores it as a job."""
    key = (os.getpid(), lane)
    with _clients_lock:
        if key not in _coalescers:
            _coalescers[key] = Coalescer(
                lambda batch, exp: send_message(batch, settings, lane, exp)
            )
        coalescer = _coalescers[key]
    coalescer.send(request, expires)


def wait_answer(r: redis.Redis, request_id: str, timeout: float) -> dict[str, Any] | None:
    """The answer, or None when none came within `timeout` seconds."""
    if timeout <= 0:
        return None
    # BLPOP counts whole seconds below Redis 6; it takes a float since.
    got = r.blpop([reply_key(request_id)], timeout=max(timeout, 0.01))
    return None if got is None else json.loads(got[1])


def read_result(r: redis.Redis, request_id: str) -> dict[str, Any] | None:
    data = r.get(result_key(request_id))
    return None if data is None else json.loads(data)


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
