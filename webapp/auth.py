"""Bearer API-key authentication for the JSON API."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from flask import abort, current_app, g, request

from db.queries import account_for_key
from db.session import session_factory


def require_account(view: Callable[..., Any]) -> Callable[..., Any]:
    """Put the caller's account in `g.account`, or answer 401."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        header = request.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            abort(401, description="send your API key as 'Authorization: Bearer <key>'")
        with session_factory(current_app.config["LANEWAY_SETTINGS"])() as session:
            account = account_for_key(session, key.strip())
            if account is None:
                abort(401, description="the API key is not valid")
            session.expunge(account)
        g.account = account
        return view(*args, **kwargs)

    return wrapper
