"""The account's rate limit, decided in the round trip that queues a synchronous interactive
request.

Flask-Limiter counts every request in a before_request hook: a Redis round trip of its own
and, around it, the extension's per-request machinery (resolving, filtering and evaluating
the limits), together one of the largest shares of the web process's CPU on the interactive
path. An identified account's synchronous request (`POST /v1/<task>`, `POST /v1/embeddings`)
is queued for the interactive workers in one pipeline anyway (core/store/interactive_protocol
`send_and_wait`): here the limiter's own sliding-window script (webapp/ratelimit_storage.py
`ACQUIRE`) runs first in that pipeline and queues the request only when it is within the
limit; a refused request is never queued, and the script answers its waiting BLPOP at once.
One round trip for the limit, the queueing and the wait.

The window is the one Flask-Limiter counts for every other request of the account: the same
limit item, key and storage, so a request here and one to any other endpoint draw on the
same budget, on every web process. Flask-Limiter then writes the same headers and the same
429 (`RateLimitExceeded`) from what the script returned, without asking Redis again.

Every request Flask-Limiter let pass this way is still counted exactly once: a view that
answers without queueing (a bad body, a cached answer, a 413 before the view, a job made
at once) counts it through the limiter's storage before anything with a side effect
(`count_pending`), and `gated` counts whatever is left when the view ends. Only an account
whose limit is one item (`60/minute`, not `60/minute;1000/hour`) and only these endpoints
are gated; everything else goes through Flask-Limiter as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import wraps
from typing import Any

import redis
from flask import Flask, g, has_request_context, request
from flask_limiter import ApplicationLimit, Limiter, RateLimitExceeded, RequestLimit

from core.store.interactive_protocol import REPLY_TTL, REQUESTS_TTL
from webapp.ratelimit_storage import ACQUIRE, WINDOW

log = logging.getLogger(__name__)

# Set in a request's WSGI environ (never from a header) by the fast path that queued it,
# counted, and got no answer in time: the view stores it as a job (webapp/fastpath.py).
SENT = "laneway.sent"
# The endpoints whose view queues the request through the gate.
GATED = frozenset(
    [f"interactive.sync_{task}" for task in ("classify", "score", "extract", "embed")]
    + ["openai.create_embeddings"]
)

# The limiter's script, then the verdict's consequence: within the limit, the request onto
# its lane's list (KEYS[3]); refused, an empty entry onto the reply list its caller's BLPOP
# waits on (KEYS[4]), so the wait ends at once. ARGV[4..6]: the request, the list's and the
# reply's TTLs in seconds.
ACQUIRE_AND_QUEUE = (
    ACQUIRE
    + """
if acquired == 1 then
    redis.call('rpush', KEYS[3], ARGV[4])
    redis.call('expire', KEYS[3], ARGV[5])
else
    redis.call('rpush', KEYS[4], '')
    redis.call('expire', KEYS[4], ARGV[6])
end
"""
    + WINDOW
)


class Gate:
    """One request's count against its account's limit: queued with the request
    (`commands`, `settle`), or at once (`count`); `counted` once either has run."""

    def __init__(self, limiter: Limiter, limit: Any, args: list[str]) -> None:  # noqa: ANN401
        # `limit`: a RuntimeLimit, what iterating an ApplicationLimit yields (not exported).
        self.limiter, self.limit, self.args = limiter, limit, args
        self.key = limit.limit.key_for(*args)
        self.counted = self.refused = False

    @property
    def storage(self) -> Any:  # noqa: ANN401 - the limiter's OneTripRedisStorage
        return self.limiter.limiter.storage

    def commands(self, key: str, payload: bytes, reply: str) -> list[tuple[Any, ...]]:
        """The count and the request's queueing, in one command (the protocol's `Gate`)."""
        item = self.limit.limit
        keys = [*self.storage.window_keys(self.key), key, reply]
        args = [item.amount, item.get_expiry(), 1, payload, REQUESTS_TTL, REPLY_TTL]
        # EVAL, not EVALSHA: a Redis that restarted and lost its scripts must not leave the
        # BLPOP behind it waiting out its whole timeout on a NOSCRIPT error.
        return [("EVAL", ACQUIRE_AND_QUEUE, len(keys), *keys, *args)]

    def settle(self, verdict: list[int]) -> bool:
        """What the script decided: the headers' window; whether the request was queued.
        Refused within a Flask request: RateLimitExceeded (outside one, `refused`)."""
        acquired = self.storage.remember(self.key, self.limit.limit.get_expiry(), verdict)
        self.decided(acquired)
        return acquired

    def count(self) -> None:
        """Count the request now, through the limiter's storage (one script); raises
        RateLimitExceeded when over the limit. Redis away: logged and let through, as
        Flask-Limiter does (swallow_errors)."""
        self.counted = True
        try:
            acquired = self.limiter.limiter.hit(self.limit.limit, *self.args)
        except (redis.RedisError, OSError) as exc:
            log.warning("rate limit not counted, Redis is away: %s", type(exc).__name__)
            return
        self.decided(acquired)

    def window(self) -> tuple[float, int]:
        """When the window resets (a Unix time) and what it has left, as the headers show
        them (from the count just made: no round trip)."""
        return tuple(self.limiter.limiter.get_window_stats(self.limit.limit, *self.args))

    def decided(self, acquired: bool) -> None:
        """The count's verdict: shown in the answer's headers (in a Flask request), and
        RateLimitExceeded there when refused."""
        self.counted, self.refused = True, not acquired
        if not acquired:
            log.info("ratelimit %s (%s) exceeded", self.limit.limit, self.args[1])
        if not has_request_context():
            return  # the fast path (webapp/fastpath.py) hands a refusal to the app
        shown = RequestLimit(self.limiter, self.limit.limit, self.args, not acquired, True)
        context = self.limiter.context
        context.view_rate_limit, context.view_rate_limits = shown, [shown]
        if not acquired:
            raise RateLimitExceeded(self.limit)


class Gates:
    """Makes each gated request's Gate: for Flask-Limiter's request filter (`request_filter`)
    and for the web app's fast path (`for_account`), on the same limit, keys and storage.
    `limit_text(account)` is the account's limit as the limit's provider gives it for that
    account, read without a request (the fast path runs beneath Flask)."""

    def __init__(
        self,
        app: Flask,
        limiter: Limiter,
        limit: ApplicationLimit,
        prefix: str,
        account_key: Callable,
        limit_text: Callable[[Any], str],
    ) -> None:
        self.app, self.limiter, self.limit = app, limiter, limit
        self.prefix, self.account_key, self.limit_text = prefix, account_key, limit_text
        self.runtime: dict[str, list[Any]] = {}  # per limit string, as Flask-Limiter parses it

    def for_account(self, account: Any) -> Gate | None:  # noqa: ANN401 - an Account
        """The account's Gate, None when its limit is not one item."""
        text = self.limit_text(account)
        limits = self.runtime.get(text)
        if limits is None:
            # Once per limit string: Flask-Limiter parses it through its provider, which
            # reads the account from `g`.
            with self.app.app_context():
                g.account = account
                limits = self.runtime[text] = list(self.limit)
        if len(limits) != 1:
            return None
        (one,) = limits
        # An ApplicationLimit's scope is its name ("global"), whatever the endpoint.
        args = [self.account_key(account.id), one.scope_for("", None)]
        return Gate(self.limiter, one, [self.prefix, *args] if self.prefix else args)

    def request_filter(self) -> Callable[[], bool]:
        """Flask-Limiter's request filter: True (Flask-Limiter leaves the request alone) for
        an identified account's POST to a gated endpoint under a one-item limit, with the
        request's Gate in g.rate_gate (counted already when the fast path sent it)."""

        def gate_it() -> bool:
            account = g.get("account")
            if request.method != "POST" or request.endpoint not in GATED or account is None:
                return False
            gate = self.for_account(account)
            if gate is None:
                return False
            gate.counted = SENT in request.environ  # by the fast path that queued it
            g.rate_gate = gate
            return True

        return gate_it


def pending() -> Gate | None:
    """This request's gate while it has not been counted (None outside a request)."""
    gate = g.get("rate_gate") if has_request_context() else None
    return gate if gate is not None and not gate.counted else None


def show_counted() -> None:
    """A request the fast path counted: its answer shows the window that count left."""
    gate = g.get("rate_gate")
    if gate is not None:
        gate.decided(True)


def count_pending() -> None:
    """Count this request now if a gate holds it uncounted (before a side effect)."""
    gate = pending()
    if gate is not None:
        gate.count()


def gated(view: Callable[..., Any]) -> Callable[..., Any]:
    """A gated endpoint's view: whatever it answers, its request is counted once (a refusal
    replaces the answer with the 429)."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401 - a Flask view's answer
        try:
            return view(*args, **kwargs)
        finally:
            count_pending()

    return wrapper
