"""The interactive path's protocol, shared by the web app (which sends requests and waits
for their answers: webapp/interactive_client.py) and the interactive workers (which batch
them and answer: workers/interactive_server.py).

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
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from laneway import tracing

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
