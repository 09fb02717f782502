"""API keys a web process has looked up, trusted for LANEWAY_AUTH_CACHE_SECONDS.

Looking a bearer key up in Postgres (the key row, then its account) on every request is a
large share of a web process's CPU on the interactive path. A process keeps what it found
for a few seconds: the key's hash (never the key), its prefix, its revocation moment and
the account's columns. Each request gets an account object of its own, made from that copy,
and the key's liveness is judged again at every request (a rotation's future revocation
moment takes effect on time). A change in Postgres (a revoked key, a new account type)
reaches the process within the TTL: that is the bound the docs state. A key that was not
found is never kept: a new key works at once, and a wrong one always costs a look-up.

A key in use is read again before its copy lapses (past half its TTL, by `refresh`: the
web process's read-ahead pool, webapp/refresh_ahead.py), so a steady caller's requests never wait
on Postgres; the copy is trusted only until its own end, so the bound holds as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from db.accounts import hash_key, is_live
from db.models import Account, ApiKey

log = logging.getLogger(__name__)

# Keys kept per process at most; the oldest goes first.
MAX_KEYS = 10_000
ACCOUNT_COLUMNS = tuple(c.key for c in Account.__table__.columns)
# What a look-up yields: the key's prefix, its revocation moment, the account's columns.
KeyRow = tuple[str, "datetime | None", dict[str, Any]]


@dataclass(frozen=True)
class KnownKey:
    prefix: str
    revoked_at: datetime | None
    account: dict[str, Any]
    until: float  # monotonic time the copy is trusted until

    def live(self) -> bool:
        return is_live(self)  # type: ignore[arg-type] - it reads revoked_at alone


class KeyCache:
    """Per web process: key hash -> KnownKey, for `ttl` seconds (0: off). `refresh` runs a
    look-up out of the request's way (a pool's submit); None: keys are read again only once
    their copy has lapsed, by the request that finds it so."""

    def __init__(
        self,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        refresh: Callable[[Callable[[], None]], Any] | None = None,
    ) -> None:
        self.ttl = ttl
        self.clock = clock
        self.refresh = refresh
        self._known: OrderedDict[str, KnownKey] = OrderedDict()
        self._refreshing: set[str] = set()
        self._lock = threading.Lock()

    def find(
        self,
        key: str,
        look_up: Callable[[], KeyRow | None],
        make: Callable[[dict[str, Any]], Any] | None = None,
    ) -> tuple[Account, str] | None:
        """The key's account (an object of this request's own) and prefix, or None when the
        key is not live; `look_up` reads the live key from Postgres (`key_row`) when no
        trusted copy is at hand. `make` makes the account from its columns (default: a
        detached ORM Account; `read_only` where the caller only reads them)."""
        digest = hash_key(key)
        now = self.clock()
        with self._lock:
            known = self._known.get(digest)
        if known is None or known.until <= now:
            found = look_up()
            if found is None:
                with self._lock:
                    self._known.pop(digest, None)
                return None
            known = KnownKey(*found, until=now + self.ttl)
            self._keep(digest, known)
        elif self.refresh is not None and known.until - now < self.ttl / 2:
            self._read_ahead(digest, look_up)
        if not known.live():
            return None
        return (make or _account)(known.account), known.prefix

    def _keep(self, digest: str, known: KnownKey) -> None:
        if self.ttl > 0:
            with self._lock:
                self._known[digest] = known
                self._known.move_to_end(digest)
                while len(self._known) > MAX_KEYS:
                    self._known.popitem(last=False)

    def _read_ahead(self, digest: str, look_up: Callable[[], KeyRow | None]) -> None:
        """Read the key again in the background (once at a time per key): a copy that is
        trusted from the look-up's start, or none when the key is no longer live."""
        with self._lock:
            if digest in self._refreshing:
                return
            self._refreshing.add(digest)

        def read() -> None:
            try:
                started = self.clock()
                found = look_up()
                if found is None:
                    with self._lock:
                        self._known.pop(digest, None)
                else:
                    self._keep(digest, KnownKey(*found, until=started + self.ttl))
            except Exception as exc:  # noqa: BLE001 - the copy lapses; a request reads again
                log.warning("could not read an API key ahead: %s", type(exc).__name__)
            finally:
                with self._lock:
                    self._refreshing.discard(digest)

        try:
            self.refresh(read)  # type: ignore[misc]
        except RuntimeError:  # the pool is shut down: the copy lapses as without one
            with self._lock:
                self._refreshing.discard(digest)

    def clear(self) -> None:
        with self._lock:
            self._known.clear()

    def __len__(self) -> int:
        return len(self._known)


def key_row(row: ApiKey | None) -> KeyRow | None:
    """What the cache keeps of a live key row (read inside its session): prefix, revocation
    moment, the account's columns."""
    if row is None:
        return None
    account = row.account
    return row.prefix, row.revoked_at, {name: getattr(account, name) for name in ACCOUNT_COLUMNS}


def _account(columns: dict[str, Any]) -> Account:
    """A detached account of the request's own: nothing a view does to it reaches another."""
    return Account(**columns)


def read_only(columns: dict[str, Any]) -> SimpleNamespace:
    """The account's columns as attributes, without an ORM instance (whose state tracking
    costs the interactive fast path a few percent of its CPU): for a caller that only
    reads them. A copy all the same: nothing done to it reaches the kept columns."""
    return SimpleNamespace(**columns)
