"""Errors answer JSON `{"error", "message"}` (HTML on the web pages), naming the problem."""

from __future__ import annotations

import logging

from flask import Flask, Response, current_app, g, jsonify, render_template, request
from gunicorn.http.errors import ParseException
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from werkzeug.exceptions import BadRequest, HTTPException

log = logging.getLogger(__name__)
# Postgres unreachable, its connection lost mid-request, or no pooled connection in time:
# the request can be sent again once it is back. Each rolled back whatever it had begun.
DATABASE_DOWN = (OperationalError, InterfaceError, PoolTimeout)
DATABASE_RETRY_AFTER = 5


# The OpenAI-compatible endpoints answer errors in OpenAI's shape, which its SDK reads.
OPENAI_BLUEPRINT = "openai"
OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
# Their paths: a request no route matched (a 405, `/v1/models/`) has no blueprint, and an
# OpenAI client still reads its error.
OPENAI_PATHS = ("/v1/embeddings", "/v1/models")


def openai_shaped() -> bool:
    """Whether this request's errors take OpenAI's shape."""
    path = request.path
    return request.blueprint == OPENAI_BLUEPRINT or (
        request.blueprint is None
        and any(path == p or path.startswith(p + "/") for p in OPENAI_PATHS)
    )


def error_response(status: int, error: str, message: str, param: str | None = None) -> Response:
    """`{"error", "message"}`; under the OpenAI-compatible endpoints, OpenAI's
    `{"error": {"message", "type", "param", "code"}}` with the same code and message."""
    if openai_shaped():
        kind = OPENAI_TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        body = {"message": message, "type": kind, "param": param, "code": error}
        response = jsonify(error=body)
    else:
        response = jsonify(error=error, message=message)
    response.status_code = status
    return response


def size_text(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def too_large_message() -> str:
    """Which body limit a 413 hit: the account type's, the fleet's, or a form field's."""
    settings = current_app.config["LANEWAY_SETTINGS"]
    account = g.get("account")
    if account is not None:
        limit = settings.limits_for(account.type).max_upload_bytes
        where = f"the limit for {account.type} accounts (LANEWAY_MAX_UPLOAD_BYTES_"
        where += f"{account.type.upper()})"
    else:
        limit, where = settings.max_upload_bytes, "the limit (LANEWAY_MAX_UPLOAD_BYTES)"
    if request.content_length is None or request.content_length > limit:
        return f"the request body is larger than {size_text(limit)}, {where}"
    form_limit = request.max_form_memory_size or 0
    return (
        f"a form field is larger than {size_text(form_limit)} or the form has more than "
        f"{request.max_form_parts} parts: send the data as a file part (with a filename)"
    )


def database_unavailable(exc: Exception) -> Response | tuple[str, int, dict[str, str]]:
    """503 with Retry-After while Postgres cannot be reached, never a 500."""
    log.warning("database unavailable: %s", type(exc).__name__)
    message = "the database is unavailable; nothing was stored: retry after Retry-After seconds"
    retry = {"Retry-After": str(DATABASE_RETRY_AFTER)}
    if request.blueprint == "pages":
        name = "Service Unavailable"
        html = render_template("pages/error.html", code=503, name=name, message=message)
        return html, 503, retry
    response = error_response(503, "database_unavailable", message)
    response.headers.update(retry)
    return response


def register_error_handlers(app: Flask) -> None:
    for exc_type in DATABASE_DOWN:
        app.register_error_handler(exc_type, database_unavailable)

    @app.errorhandler(ParseException)
    def _malformed_body(exc: ParseException) -> Response | tuple[str, int]:
        # gunicorn reads a chunked body as the app asks for it: a bad chunk size, a
        # missing terminator or a bad trailer surfaces here, not as Werkzeug's 400. The
        # connection is not reused after it (gunicorn marks the body failed).
        return _http_error(BadRequest(f"the request body's chunked framing is malformed: {exc}"))

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Response | tuple[str, int]:
        code = exc.code or 500
        message = too_large_message() if code == 413 else (exc.description or exc.name)
        if request.blueprint == "pages":
            html = render_template("pages/error.html", code=code, name=exc.name, message=message)
            return html, code
        response = error_response(code, exc.name.lower().replace(" ", "_"), message)
        if code == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        if code == 405 and exc.valid_methods:  # type: ignore[attr-defined]
            response.headers["Allow"] = ", ".join(exc.valid_methods)  # type: ignore[attr-defined]
        return response
