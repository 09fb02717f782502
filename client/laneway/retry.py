"""When the client sends a request again: which failures, how long to wait, and when to stop.

Written on httpx alone: httpx's own transport `retries=` covers only failed connects, with
no backoff and no status codes, and the libraries that do more (tenacity, stamina,
httpx-retries) would be the client's second dependency for about forty lines.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

# Answers that say "not now" before anything was stored: a timeout at a proxy (408, 504),
# the rate limit (429), a proxy that found no web process (502), a full lane or the
# database away (503).
RETRIED_STATUSES = frozenset({408, 429, 502, 503, 504})
# Failures of the network itself: a refused or dropped connection, a read that timed out.
# A job submission carries an Idempotency-Key, so one whose answer was lost is safe to
# send again; the other calls store nothing or are idempotent already.
RETRIED_ERRORS = (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """`Retry-After` in seconds: delta-seconds or an HTTP date (RFC 9110); None if absent
    or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


@dataclass(frozen=True)
class Retry:
    """The caller's bound on sending again: at most `retries` more times and, when `total`
    is set, no retry that would end past `total` seconds after the first try.

    Each wait is the server's Retry-After when it sends one, else `base` x 2^attempt; with
    `jitter`, a schedule wait is drawn from its upper half, so many clients refused at
    once do not come back at once. No wait passes `cap` (a mistaken Retry-After of a day
    does not hang the caller)."""

    retries: int = 5
    total: float | None = None
    base: float = 0.5
    cap: float = 30.0
    jitter: bool = True
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def delay(self, attempt: int, retry_after: str | None) -> float:
        """Seconds to wait before retry number `attempt` (0 for the first)."""
        asked = parse_retry_after(retry_after)
        if asked is not None:
            return min(self.cap, asked)
        wait = min(self.cap, self.base * 2**attempt)
        return self.rng.uniform(wait / 2, wait) if self.jitter else wait


Backoff = Retry  # the name of the 0.1 client


class Attempts:
    """One request's retries under a `Retry`: `next_delay` says how long to wait before
    sending again, or None to stop. Shared by the sync and async clients, which differ
    only in how they sleep."""

    def __init__(self, policy: Retry, clock=time.monotonic) -> None:  # noqa: ANN001
        self.policy, self.clock = policy, clock
        self.started, self.done = clock(), 0

    def next_delay(self, response: httpx.Response | None) -> float | None:
        """After a retryable failure (`response` None for a network error)."""
        if self.done >= self.policy.retries:
            return None
        header = response.headers.get("Retry-After") if response is not None else None
        wait = self.policy.delay(self.done, header)
        if self.policy.total is not None and self.clock() - self.started + wait > self.policy.total:
            return None
        self.done += 1
        return wait
