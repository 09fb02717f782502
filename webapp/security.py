"""Rate limits per account (Flask-Limiter on Redis), CSRF (Flask-WTF), the session cookie's
secret and settings, and the security headers every response carries."""

from __future__ import annotations

import math
import os
import secrets
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from flask import Flask, Response, abort, current_app, g, request
from flask.sessions import SecureCookieSessionInterface
from flask_limiter import ApplicationLimit, Limiter
from flask_wtf.csrf import CSRFProtect

from core.config.settings import Settings
from core.store.redis_conn import client_url
from webapp import ratelimit_gate, ratelimit_storage
from webapp.auth import BEARER_BLUEPRINTS, identify
from webapp.errors import error_response
from webapp.jsonbudget import too_costly

# Nothing from other origins: no CDN, no inline script or style, no framing by anyone.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Not no-referrer: over HTTPS, Flask-WTF checks that a form post's Referer is this site.
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def secret_key(settings: Settings) -> str:
    """LANEWAY_SECRET_KEY, else a key generated once and kept in LANEWAY_HOME/secret_key,
    so every web process on this machine signs sessions alike and restarts keep them."""
    if settings.secret_key:
        return settings.secret_key
    path = Path(settings.home) / "secret_key"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    # Written whole under a temporary name, then linked into place: the name appears only
    # with the whole key behind it, and of several processes starting at once the first
    # link wins and the others read its key.
    fd, tmp = tempfile.mkstemp(prefix=".secret_key.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(48) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    return _read_key(path)


def _read_key(path: Path) -> str:
    key = path.read_text().strip()
    if not key:
        raise RuntimeError(f"{path} is empty: delete it, or set LANEWAY_SECRET_KEY")
    return key


KEY_PREFIX = "laneway"  # the limiter's keys in Redis

# Where the bearer blueprints' routes live, and only theirs (a test holds the URL map to it).
BEARER_PATHS = "/v1/"


class PagesOnlySessions(SecureCookieSessionInterface):
    """Flask's signed-cookie session for the web pages alone. The bearer APIs never read or
    write it (webapp/auth.py): their requests skip opening it (a signer built and the
    cookie read on every request, a share of the interactive path's CPU) and saving it, so
    an API call carrying a browser's cookie never refreshes it either. Flask opens the
    session before it matches the URL to a blueprint: the path tells them apart."""

    def open_session(self, app: Flask, request: Any) -> Any:  # noqa: ANN401 - Flask's types
        if request.path.startswith(BEARER_PATHS):
            return self.make_null_session(app)
        return super().open_session(app, request)


def limiter_storage_url(redis_url: str) -> str:
    """The rate limiter's storage: `limits`' Redis storage in one round trip per request
    (webapp/ratelimit_storage.py); `limits` spells a unix-socket Redis `redis+unix://`."""
    url = client_url(redis_url)
    url = "redis+unix://" + url[len("unix://") :] if url.startswith("unix://") else url
    return ratelimit_storage.PREFIX + url


def account_rate_key(account_id: int) -> str:
    # Never the key itself: rate-limit keys are logged when a limit is hit.
    return f"account:{account_id}"


def _rate_key() -> str:
    account = g.get("account")
    return account_rate_key(account.id) if account is not None else f"address:{request.remote_addr}"


def init_security(app: Flask, settings: Settings) -> Limiter:
    """Wire identification, rate limits, CSRF, cookie settings and headers into the app."""
    app.config.update(
        SECRET_KEY=secret_key(settings),
        SESSION_COOKIE_NAME="laneway_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.secure_cookies,
        # The cookie's own expiry; webapp/sessions.py holds a sign-in to it from its start.
        PERMANENT_SESSION_LIFETIME=timedelta(seconds=settings.session_lifetime),
        # A login form's token lives as long as its session, not one hour.
        WTF_CSRF_TIME_LIMIT=None,
    )
    app.session_interface = PagesOnlySessions()
    # Order matters: the caller must be known before the limiter picks their bucket.
    app.before_request(identify)
    # after_request hooks run in reverse order: this one sees the limiter's headers.
    app.after_request(_rate_limit_headers)

    def limit_text(account: Any) -> str:  # noqa: ANN401 - an Account, or None
        if account is None:
            return settings.anonymous_rate_limit
        return settings.limits_for(account.type).rate_limit

    def rate_limit() -> str:
        return limit_text(g.get("account"))

    def breach_message() -> str:
        account = g.get("account")
        if account is None:
            return (
                f"too many requests without a valid API key from this address "
                f"(limit {settings.anonymous_rate_limit}, LANEWAY_RATE_LIMIT_ANONYMOUS)"
            )
        return (
            f"too many requests: {account.type} accounts may make "
            f"{settings.limits_for(account.type).rate_limit} "
            f"(LANEWAY_RATE_LIMIT_{account.type.upper()}); retry after Retry-After seconds"
        )

    account_limit = ApplicationLimit(rate_limit, error_message=breach_message)
    limiter = Limiter(
        _rate_key,
        application_limits=[account_limit],
        storage_uri=limiter_storage_url(settings.redis_url),
        storage_options={"socket_timeout": 5},
        strategy="sliding-window-counter",
        key_prefix=KEY_PREFIX,
        headers_enabled=True,
        retry_after="delta-seconds",
        # Redis down must not turn every request into a 500: the limiter logs and lets it pass.
        swallow_errors=True,
    )
    limiter.init_app(app)
    # A synchronous interactive request is counted in the round trip that queues it.
    gates = ratelimit_gate.Gates(
        app, limiter, account_limit, KEY_PREFIX, account_rate_key, limit_text
    )
    limiter.request_filter(gates.request_filter())
    app.extensions["laneway_gates"] = gates
    # Load balancers, probes, Prometheus and KEDA poll these, all from few addresses and
    # without a key: they must never be refused.
    for view in ("ops.livez", "ops.healthz", "ops.metrics", "ops.lanes"):
        limiter.exempt(app.view_functions[view])
    # Before the CSRF check, which cannot read a form with a nameless part (a 500).
    app.before_request(_refuse_nameless_parts)
    app.before_request(_refuse_costly_json)
    csrf = CSRFProtect(app)
    for name in BEARER_BLUEPRINTS:
        csrf.exempt(app.blueprints[name])
    app.after_request(_security_headers)
    return limiter


def _refuse_nameless_parts() -> None:
    """A form part without a name is no form a page sent: 400, not a crash further on."""
    if request.method == "POST" and (request.blueprint or "") not in BEARER_BLUEPRINTS:
        if None in request.form or None in request.files:
            abort(400, description="the form has a part without a name")


def _refuse_costly_json() -> Response | None:
    """413 for a JSON body shaped to cost far more memory to parse than its size
    (webapp/jsonbudget.py), before anything parses it; only for a caller with an account
    (the view answers others 401 without reading the body)."""
    if request.method not in ("POST", "PUT", "PATCH", "DELETE") or g.get("account") is None:
        return None
    # Any type but an upload: the admin API reads a body as JSON whatever its type says.
    if (request.blueprint or "") not in BEARER_BLUEPRINTS or request.mimetype.startswith(
        "multipart/"
    ):
        return None
    problem = too_costly(request.get_data())  # kept: the view reads the same bytes
    if not problem:
        return None
    ratelimit_gate.count_pending()  # over the limit: the 429, as before any other answer
    return error_response(413, "body_too_complex", problem)


def _rate_limit_headers(response: Response) -> Response:
    """Besides Flask-Limiter's X-RateLimit-* (reset as a Unix time), the IETF draft's
    RateLimit-* (reset in seconds) and RateLimit-Policy. The limiter adds Retry-After to
    every answer; it stays only where it means something: a 429, or a 503 (a full lane)."""
    for limiter in current_app.extensions.get("limiter", ()):
        current = limiter.current_limit
        if current is None:
            continue
        try:
            reset_time, remaining = current.window
        except Exception:  # noqa: BLE001 - storage gone: the limiter already let it pass
            continue
        response.headers.update(draft_headers(current.limit, reset_time, remaining))
    if response.status_code == 503:
        # Its own Retry-After (when the lane may have room), which the limiter stretched to
        # its window's reset: a view that names one in g.retry_after gets it back.
        if g.get("retry_after"):
            response.headers["Retry-After"] = g.retry_after
        return response
    if response.status_code != 429:
        response.headers.pop("Retry-After", None)
    elif response.headers.get("Retry-After") == "0":
        response.headers["Retry-After"] = "1"  # "0" would invite an immediate retry
    return response


def draft_headers(item: Any, reset_time: float, remaining: int) -> dict[str, str]:  # noqa: ANN401
    """The IETF draft's RateLimit-* of a limit item's window (the fast path's too)."""
    return {
        "RateLimit-Limit": str(item.amount),
        "RateLimit-Remaining": str(max(0, remaining)),
        "RateLimit-Reset": str(max(0, math.ceil(reset_time - time.time()))),
        "RateLimit-Policy": f"{item.amount};w={item.get_expiry()}",
    }


def _security_headers(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    if request.is_secure:
        response.headers.setdefault("Strict-Transport-Security", "max-age=31536000")
    return response
