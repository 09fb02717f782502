"""The interactive path's protocol, shared by the web app (which sends requests and waits
for their answers: webapp/interactive_client.py) and the interactive workers (which batch
them and answer: workers/interactive_server.py).

A request is a few items for a few tasks, with its texts (it is small: at most
LANEWAY_SYNC_MAX_ITEMS items). It travels as one JSON entry on its lane's request list in
Redis (`requests_key`: `laneway:interactive:<lane>:requests`), which batch chunks never use:
the web thread pushes it and blocks on its answer's list in the same round trip
(`send_and_wait`), and the lane's interactive workers pop up to a batch of entries at a time
(`pop`). A Celery message each way costs more CPU than the model's forward for a lone
request; the worker stays a Celery worker for everything else (supervision, heartbeats,
Flower, remote control), and still answers a request sent as a Celery message on
`interactive.<lane>` (TASK_NAME).

The answer comes back through Redis, not the result backend: the worker pushes it onto a
list the web thread is blocked on (BLPOP), and for the asynchronous pair also keeps it
under the request's id for GET /v1/result/<id>. A synchronous request carries its
`deadline`: a worker that takes it later drops it unanswered, because by then its caller
has stored it as a normal job in Postgres (the web app's 202), so nothing is lost and
nothing is computed twice for nobody.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from core.obs import tracing
from core.store.redis_conn import round_trip
from core.util.jsoncodec import dumps_bytes, loads

log = logging.getLogger(__name__)
TASK_NAME = "laneway.interactive"
RESULT_TTL = 24 * 3600  # seconds an asynchronous result (and its owner) is kept
REPLY_TTL = 120  # seconds an unread synchronous answer is kept
# A lane's request list lapses this long after its last push: requests that no worker took
# (none is running) are not kept for ever; the asynchronous pair's results live as long.
REQUESTS_TTL = RESULT_TTL
PENDING, SUCCESS, FAILURE = "PENDING", "SUCCESS", "FAILURE"


def requests_key(lane: str) -> str:
    """The list a lane's (`cpu`, `gpu`) requests wait on for its interactive workers."""
    return f"laneway:interactive:{lane}:requests"


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
    # and batches, so each carries its own (core/obs/tracing.py).
    trace: dict[str, str] | None = None
    # time.time() after which nobody waits for the answer (the caller stored the request as
    # a job): a worker drops it. None: the asynchronous pair, kept until answered.
    deadline: float | None = None

    def stale(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline

    def message(self) -> dict[str, Any]:
        data = self.__dict__.copy()
        for optional in ("trace", "deadline"):
            if data[optional] is None:
                del data[optional]  # the message is what a worker of the last release reads
        return data

    def encode(self) -> bytes:
        return dumps_bytes(self.message())

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
    stages += [("model", t["model"])] if "model" in t else []  # inside `run`
    stages += [("reply", max(0.0, waited * 1000 - inside)), ("view", total * 1000)]
    stages.append(("batch", t.get("batch_items", 0)))
    return ", ".join(f"{name};dur={value:.2f}" for name, value in stages)


def deliver(r: redis.Redis, answers: Sequence[tuple[Request, dict[str, Any]]]) -> None:
    """Hand each answer to whoever waits: the web thread's list, and for the asynchronous
    pair the result kept under the request's id; one round trip for them all."""
    commands: list[tuple[Any, ...]] = []
    for request, body in answers:
        data = dumps_bytes(body)
        if request.keep:
            commands.append(("SET", result_key(request.id), data, "EX", RESULT_TTL))
        commands.append(("RPUSH", reply_key(request.id), data))
        commands.append(("EXPIRE", reply_key(request.id), REPLY_TTL))
    if commands:
        round_trip(r, commands)


def push_commands(lane: str, requests: Sequence[Request]) -> list[tuple[Any, ...]]:
    """The commands that queue requests on their lane's list."""
    key = requests_key(lane)
    return [("RPUSH", key, *(r.encode() for r in requests)), ("EXPIRE", key, REQUESTS_TTL)]


def push(pipe: redis.client.Pipeline, lane: str, requests: Sequence[Request]) -> None:
    """Queue requests on their lane's list (in a pipeline the caller executes)."""
    for command in push_commands(lane, requests):
        pipe.execute_command(*command)


class Gate(Protocol):
    """What may stand before a request's queueing in `send_and_wait`'s round trip (the web
    app's rate limit: webapp/ratelimit_gate.py): it adds commands that queue the request on
    `key` or refuse it, answering the `reply` list at once when refused, and reads their
    first reply's verdict (raising when refused)."""

    def commands(self, key: str, payload: bytes, reply: str) -> list[tuple[Any, ...]]:
        """The commands that queue `payload` on `key` (or refuse it)."""

    def settle(self, verdict: Any) -> bool:  # noqa: ANN401 - what the gate's command returned
        """Read the first command's reply: whether the request was queued (or raise)."""


def send_and_wait(
    r: redis.Redis, request: Request, lane: str, timeout: float, gate: Gate | None = None
) -> dict[str, Any] | None:
    """Queue a request for its lane's interactive workers and wait up to `timeout` seconds
    for its answer, in one round trip (the push and the BLPOP travel in one pipeline: Redis
    runs the push, then blocks the connection on the answer); a `gate` queues it instead,
    in the same pipeline. None: no answer in time."""
    if timeout <= 0:
        return None
    request.deadline = time.time() + timeout
    reply = reply_key(request.id)
    if gate is None:
        commands = push_commands(lane, [request])
    else:
        commands = gate.commands(requests_key(lane), request.encode(), reply)
    commands.append(("BLPOP", reply, max(timeout, 0.01)))
    got = round_trip(r, commands)
    if gate is not None and not gate.settle(got[0]):
        return None  # refused: never queued (the BLPOP took the gate's empty answer)
    return None if got[-1] is None else loads(got[-1][1])


class Popper:
    """Takes up to `count` requests at a time off a lane's list, blocking up to `timeout`
    seconds for the first: one BLMPOP (Redis 7); on an older Redis (the embedded one may
    be 6.2), BLPOP for the first and LPOP for the rest."""

    def __init__(self, r: redis.Redis, lane: str) -> None:
        self.redis, self.key = r, requests_key(lane)
        self.blmpop = True

    def pop(self, count: int, timeout: float) -> list[bytes]:
        if self.blmpop:
            try:
                command = ("BLMPOP", timeout, 1, self.key, "LEFT", "COUNT", count)
                (got,) = round_trip(self.redis, [command])  # the feeder thread's own connection
                return [] if got is None else list(got[1])
            except redis.ResponseError as exc:
                if "unknown command" not in str(exc).lower():
                    raise
                self.blmpop = False
        first = self.redis.blpop([self.key], timeout=timeout)
        if first is None:
            return []
        more = self.redis.lpop(self.key, count - 1) if count > 1 else None
        return [first[1], *(more or [])]

    def put_back(self, raws: Sequence[bytes]) -> None:
        """Requests taken and not started go back to the head of the list, in order."""
        if raws:
            self.redis.lpush(self.key, *reversed(raws))
            self.redis.expire(self.key, REQUESTS_TTL)


def parse(raw: bytes) -> Request | None:
    """A request from its list entry; None for one that is not a request (logged)."""
    try:
        request = Request.from_message(loads(raw))
    except (ValueError, TypeError) as exc:
        log.warning("dropped an unreadable interactive request: %s", type(exc).__name__)
        return None
    lists = (request.tasks, request.labels, request.ids, request.texts)
    if not (
        isinstance(request.id, str)
        and all(isinstance(x, list) and all(isinstance(v, str) for v in x) for x in lists)
        and len(request.ids) == len(request.texts)
        and isinstance(request.deadline, int | float | None)
        and isinstance(request.sent, int | float)
    ):
        log.warning("dropped a malformed interactive request")
        return None
    return request


def wait_answer(r: redis.Redis, request_id: str, timeout: float) -> dict[str, Any] | None:
    """The answer, or None when none came within `timeout` seconds."""
    if timeout <= 0:
        return None
    # BLPOP counts whole seconds below Redis 6; it takes a float since.
    got = r.blpop([reply_key(request_id)], timeout=max(timeout, 0.01))
    return None if got is None else loads(got[1])


def read_result(r: redis.Redis, request_id: str) -> dict[str, Any] | None:
    data = r.get(result_key(request_id))
    return None if data is None else loads(data)
