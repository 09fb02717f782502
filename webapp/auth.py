"""Who is calling: a bearer API key for the JSON API, a signed session for the web pages.

`identify` runs before every request (and before the rate limiter, which counts per
account); the API blueprints then refuse a caller without an account (401) or, under
/v1/admin, without an admin account (403). The API never reads the session cookie, so
it needs no CSRF token: a browser cannot attach a bearer header on another site's behalf.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from flask import Flask, abort, current_app, g, request, session

from core.config.settings import Settings
from db.accounts import is_live, live_key
from db.models import Account, ApiKey
from db.session import session_factory
from webapp import sessions
from webapp.keycache import KeyCache, KeyRow, key_row
from webapp.refresh_ahead import read_ahead

# Blueprints whose callers authenticate with `Authorization: Bearer <key>`.
BEARER_BLUEPRINTS = ("api", "admin", "interactive", "openai")
BEARER_HELP = "send your API key as 'Authorization: Bearer <key>'"


def app_settings() -> Settings:
    """The settings the running app was made with."""
    return current_app.config["LANEWAY_SETTINGS"]


def identify() -> None:
    """Set g.account (or None) and g.key_prefix for this request; never refuse here."""
    g.account = None
    g.key_prefix = None
    g.auth_problem = BEARER_HELP
    blueprint = request.blueprint or ""
    if blueprint in BEARER_BLUEPRINTS:
        _from_bearer()
    elif blueprint == "pages" and "key_id" in session:
        _from_session()


def _load(find: Callable[[Any], ApiKey | None]) -> None:
    settings = app_settings()
    with session_factory(settings)() as db:
        row = find(db)
        if row is None:
            return
        account: Account = row.account
        db.expunge(account)
        _identified(settings, account, row.prefix)


def _identified(settings: Settings, account: Account, prefix: str) -> None:
    g.account, g.key_prefix = account, prefix
    # The body is read later, in the view: hold it to the account type's upload limit.
    request.max_content_length = settings.limits_for(account.type).max_upload_bytes


def key_cache(app: Flask | None = None) -> KeyCache:
    """This web process's trusted API keys (webapp/keycache.py), read again ahead of their
    lapse (webapp/refresh_ahead.py)."""
    app = app or current_app
    cache = app.extensions.get("laneway_keys")
    if cache is None:
        settings = app.config["LANEWAY_SETTINGS"]
        made = KeyCache(settings.auth_cache_seconds, refresh=read_ahead)
        cache = app.extensions.setdefault("laneway_keys", made)
    return cache


def bearer_key(authorization: str) -> str | None:
    """The key of an `Authorization: Bearer <key>` header's value, else None."""
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


def account_for_key(
    key: str, app: Flask | None = None, make: Callable[[dict[str, Any]], Any] | None = None
) -> tuple[Account, str] | None:
    """The live key's account (an object of the caller's own, made by `make`: see
    KeyCache.find) and prefix, or None; `app` when called outside its requests (the fast
    path)."""
    app = app or current_app
    settings = app.config["LANEWAY_SETTINGS"]

    def look_up() -> KeyRow | None:
        with session_factory(settings)() as db:
            return key_row(live_key(db, key))

    return key_cache(app).find(key, look_up, make)


def _from_bearer() -> None:
    key = bearer_key(request.headers.get("Authorization", ""))
    if key is None:
        return
    g.auth_problem = "the API key is not valid (unknown, revoked or mistyped)"
    found = account_for_key(key)
    if found is not None:
        _identified(app_settings(), *found)


def _from_session() -> None:
    # Signed out (on any copy of this cookie), too old, or never signed in: no account.
    key_id = sessions.current_key_id(app_settings())
    if key_id is None:
        return

    def find(db: Any) -> ApiKey | None:
        row = db.get(ApiKey, key_id)
        return row if row is not None and is_live(row) else None

    _load(find)
    if g.account is None:
        session.clear()  # the key was revoked since login: sign out


def check_account() -> None:
    """401 unless the caller has an account."""
    if g.get("account") is None:
        abort(401, description=g.get("auth_problem", BEARER_HELP))


def check_admin() -> None:
    """401 without an account, 403 for an account that is not an admin."""
    check_account()
    if not g.account.is_admin:
        abort(403, description="this endpoint is for admin accounts only")


def require_account(view: Callable[..., Any]) -> Callable[..., Any]:
    """Answer 401 unless the caller has an account (the api blueprint checks this too)."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        check_account()
        return view(*args, **kwargs)

    return wrapper
