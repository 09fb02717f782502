"""Web sign-ins that the server can end: sign-out ends one on every copy of its cookie.

The signed cookie holds the key's row id, a random sign-in id and when the sign-in began.
Redis holds a record per sign-in (`laneway:websession:<sha256 of the id>`, the key's row
id, for LANEWAY_SESSION_LIFETIME seconds) that sign-out deletes. A page request counts as
signed in only while the record is there and the sign-in is younger than the lifetime, so
a cookie copied before sign-out, or kept past the lifetime, is refused. API keys never use
this. Redis unreachable: the visitor is treated as signed out until it is back (the cookie
is kept), never as signed in.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time

import redis
from flask import session

from core.config.settings import Settings
from core.store.redis_conn import redis_client

log = logging.getLogger(__name__)
PREFIX = "laneway:websession:"
CLOCK_SKEW = 60  # seconds another web machine's clock may run ahead of this one's


def _redis(settings: Settings) -> redis.Redis:
    """The Redis client for sign-in records (the process's, core/store/redis_conn.py)."""
    return redis_client(settings)


def _record(sign_in_id: str) -> str:
    # A digest, not the id: whoever reads Redis cannot make a cookie from what is there.
    return PREFIX + hashlib.sha256(sign_in_id.encode()).hexdigest()


def begin(settings: Settings, key_id: int) -> None:
    """A fresh sign-in for `key_id`; nothing from the session before it survives."""
    end(settings)
    sign_in_id = secrets.token_urlsafe(32)
    _redis(settings).set(_record(sign_in_id), str(key_id), ex=settings.session_lifetime)
    session.permanent = True
    # The key's row id, never the key: the cookie is signed, not encrypted.
    session.update(key_id=key_id, sid=sign_in_id, at=int(time.time()))


def end(settings: Settings) -> None:
    """Sign out: the record goes, so no copy of this cookie works again."""
    sign_in_id = session.get("sid")
    session.clear()
    if isinstance(sign_in_id, str):
        try:
            _redis(settings).delete(_record(sign_in_id))
        except redis.RedisError as exc:
            # The cookie is gone here; copies of it still expire with the lifetime.
            log.warning("sign-in record not deleted: %s", type(exc).__name__)


def current_key_id(settings: Settings) -> int | None:
    """The signed-in key's row id, or None: no sign-in, signed out, or too old."""
    key_id, sign_in_id, began = session.get("key_id"), session.get("sid"), session.get("at")
    if not (isinstance(key_id, int) and isinstance(sign_in_id, str) and isinstance(began, int)):
        return None
    age = time.time() - began
    if age >= settings.session_lifetime or age < -CLOCK_SKEW:
        return None
    try:
        stored = _redis(settings).get(_record(sign_in_id))
    except redis.RedisError as exc:
        log.warning("sign-in records unreadable: %s", type(exc).__name__)
        return None
    return key_id if stored is not None and stored.decode() == str(key_id) else None
