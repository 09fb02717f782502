"""A synchronous interactive request's common case answered beneath Flask.

On the interactive path Flask's own per-request machinery (the request and app contexts,
the before- and after-request hooks, the rate limiter's extension, the error handlers)
costs the web process more CPU than everything the request needs: who the caller is, its
body, its count against the rate limit, the round trip to the interactive workers and the
JSON answer. `FastPath` wraps the app's WSGI callable and answers `POST /v1/<task>`
itself when the request is the plain case: a small JSON body with a length, a bearer key
the key cache knows, valid input, no `Prefer` header, tracing off, an account whose limit
is one item, no cached answer, a worker's answer in time. It uses the same pieces as the
Flask view (webapp/interactive.py `parse_sync`, webapp/auth.py `account_for_key`, the rate
limit's gate, the protocol) and writes the same answer: body, rate-limit headers,
security headers, Server-Timing.

Anything else goes to the Flask app as it came (the body read is handed on), before the
fast path has done anything that counts: a 4xx, a cached answer, a preference. Two cases
go on after the count: a request the limit refused (never queued) is handed to the app,
which counts it again and answers the 429 as always (the refusal left nothing counted); a
request queued and counted that got no answer in time goes to the app marked as sent
(`ratelimit_gate.SENT`), whose view stores it as a job (the 202) without sending it again.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis
from flask import Flask

from core.obs import tracing
from core.store import interactive_protocol as ia
from core.util.jsoncodec import dumps_bytes
from core.vocab import TASKS
from jobs.inputs import InputError
from webapp import interactive_client as ic
from webapp import ratelimit_gate
from webapp.auth import account_for_key, bearer_key
from webapp.interactive import SYNC_FIELDS, cached_results, parse_sync
from webapp.keycache import read_only
from webapp.security import SECURITY_HEADERS, draft_headers

log = logging.getLogger(__name__)
PATHS = {f"/v1/{task}": task for task in TASKS}
# A body this small is never one the parse-cost check refuses (webapp/jsonbudget.py: its
# floor alone is far above what any shape of it could cost), nor past any upload limit.
MAX_BODY = 64 * 1024

StartResponse = Callable[..., Any]


class FastPath:
    """The app's WSGI callable, with the plain synchronous request answered beneath it."""

    def __init__(self, app: Flask) -> None:
        self.app, self.inner = app, app.wsgi_app
        self.settings = app.config["LANEWAY_SETTINGS"]

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        task = PATHS.get(environ.get("PATH_INFO", ""))
        if task is None or environ.get("REQUEST_METHOD") != "POST" or not self._plain(environ):
            return self.inner(environ, start_response)
        data = environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
        environ["wsgi.input"] = io.BytesIO(data)  # handed on whole if the app answers
        answer = self._answer(environ, task, data)
        if answer is None:
            return self.inner(environ, start_response)
        status, headers, body = answer
        start_response(status, headers)
        return [body]

    def _plain(self, environ: dict[str, Any]) -> bool:
        length = environ.get("CONTENT_LENGTH") or ""
        mimetype = environ.get("CONTENT_TYPE", "").split(";", 1)[0].strip().lower()
        return (
            length.isdigit()
            and int(length) <= MAX_BODY
            and mimetype == "application/json"
            and "HTTP_TRANSFER_ENCODING" not in environ
            and "HTTP_PREFER" not in environ
            and not tracing.enabled()
        )

    def _answer(
        self, environ: dict[str, Any], task: str, data: bytes
    ) -> tuple[str, list[tuple[str, str]], bytes] | None:
        """The answer, or None for the app to give it (see the module's docstring)."""
        settings = self.settings
        try:
            prepared = self._prepare(environ, task, data)
        except Exception:  # noqa: BLE001 - nothing counted yet: the app answers it
            log.exception("the fast path could not take a request: the app answers it")
            return None
        if prepared is None:
            return None
        account, gate, tasks, labels, items, started = prepared
        req = ia.new_request(tasks, labels, items, keep=False, account=account.id)
        lane = ic.lane_for(settings)
        sent = time.perf_counter()
        body = ic.send_and_wait(settings, req, lane, settings.sync_timeout, gate)
        waited = time.perf_counter() - sent
        if gate.refused:
            return None  # never queued, nothing counted: the app counts it and answers 429
        if body is None or (body["status"] == ia.FAILURE and not body["output"]):
            environ[ratelimit_gate.SENT] = body
            if body is None:
                ic.missed(settings, lane)
            return None  # the app stores it as a job, or answers the failure
        total = time.perf_counter() - started
        payload = dumps_bytes(
            {"task": task, "results": body["output"] or [], "cached": False, "lane": lane,
             "seconds": round(total, 4)}
        )  # fmt: skip
        headers = [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(payload))),
            ("Server-Timing", ia.server_timing(body, waited, total)),
            *rate_limit_headers(gate),
            *SECURITY_HEADERS.items(),
        ]
        if environ.get("wsgi.url_scheme") == "https":
            headers.append(("Strict-Transport-Security", "max-age=31536000"))
        return "200 OK", headers, payload

    def _prepare(self, environ: dict[str, Any], task: str, data: bytes) -> tuple | None:
        """Who asks, under which gate, for what; None when the app is to answer."""
        settings = self.settings
        key = bearer_key(environ.get("HTTP_AUTHORIZATION", ""))
        found = account_for_key(key, self.app, read_only) if key else None
        if found is None:
            return None
        account = found[0]
        if len(data) > settings.limits_for(account.type).max_upload_bytes:
            return None  # the app's 413, naming the account type's limit
        try:
            tasks, labels, items = parse_sync(settings, account.type, data, SYNC_FIELDS, [task])
        except InputError:
            return None
        gate = self.app.extensions["laneway_gates"].for_account(account)
        if gate is None:
            return None
        started = time.perf_counter()
        if cached_results(settings, tasks, labels, items, account.id) is not None:
            return None
        return account, gate, tasks, labels, items, started


def rate_limit_headers(gate: ratelimit_gate.Gate) -> list[tuple[str, str]]:
    """The headers an answer within the limit carries: Flask-Limiter's X-RateLimit-* (the
    reset as a Unix time) and the IETF draft's RateLimit-* (webapp/security.py). Redis
    away when the window is read again (a wait past the count's freshness): none, as
    Flask-Limiter then writes none."""
    try:
        reset_time, remaining = gate.window()
    except (redis.RedisError, OSError) as exc:
        log.warning("rate-limit headers left out, Redis is away: %s", type(exc).__name__)
        return []
    item = gate.limit.limit
    return [
        ("X-RateLimit-Limit", str(item.amount)),
        ("X-RateLimit-Remaining", str(remaining)),
        ("X-RateLimit-Reset", str(int(reset_time + 1))),
        *draft_headers(item, reset_time, remaining).items(),
    ]
