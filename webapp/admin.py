"""The admin API under /v1/admin: accounts and their keys, for admin accounts only.

New keys are in the answer once and never again; only their hashes are stored.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, abort, jsonify, request
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.config.settings import Settings
from core.vocab import ACCOUNT_TYPES
from db.accounts import (
    add_api_key,
    create_account,
    find_key,
    is_live,
    key_prefix,
    list_accounts,
    list_keys,
    revoke_key,
    rotate_key,
    share_weight,
    share_weight_in_effect,
)
from db.common import aware
from db.models import Account, ApiKey
from db.session import session_factory
from jobs.inputs import InputError, parse_json_body, parse_name
from webapp.auth import app_settings, check_admin, key_cache
from webapp.errors import error_response

admin = Blueprint("admin", __name__, url_prefix="/v1/admin")
admin.before_request(check_admin)


@admin.after_request
def _forget_trusted_keys(response: Response) -> Response:
    """A change to keys or accounts made through this process takes effect here at once;
    the other web processes see it within LANEWAY_AUTH_CACHE_SECONDS (webapp/keycache.py)."""
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        key_cache().clear()
    return response


ACCOUNT_ID = "<int:account_id>"
# Postgres integers: a larger id would fail in the database. (Not the converter's `max`:
# werkzeug then answers 405 instead of 404 where another method shares the path.)
MAX_ACCOUNT_ID = 2**31 - 1
MAX_GRACE_SECONDS = 30 * 24 * 3600


def key_view(row: ApiKey) -> dict[str, Any]:
    revoked = aware(row.revoked_at)
    return {
        "prefix": row.prefix,
        "name": row.name,
        "created_at": aware(row.created_at).isoformat(),
        "revoked_at": revoked.isoformat() if revoked else None,
        "live": is_live(row),
    }


def account_view(
    account: Account, settings: Settings, keys: list[ApiKey] | None = None
) -> dict[str, Any]:
    limits = settings.limits_for(account.type)
    weight, is_default = share_weight_in_effect(account, settings)
    view: dict[str, Any] = {
        "id": account.id,
        "name": account.name,
        "type": account.type,
        "is_admin": account.is_admin,
        "created_at": aware(account.created_at).isoformat(),
        "limits": {
            "rate_limit": limits.rate_limit,
            "max_items": limits.max_items,
            "max_upload_bytes": limits.max_upload_bytes,
        },
        "share_weight": weight,
        "share_weight_is_default": is_default,
    }
    if keys is not None:
        view["keys"] = [key_view(k) for k in keys]
    return view


def _created_key(row: ApiKey, key: str) -> dict[str, Any]:
    return {"key": key, **key_view(row)}


def _name(body: dict[str, Any], field: str, required: bool) -> str | None:
    value = body.get(field)
    if value is None and not required:
        return None
    return parse_name(value, f"'{field}'")


def _body(allowed: tuple[str, ...]) -> dict[str, Any]:
    """The JSON object body; an empty body counts as {} (every field here is optional
    except where the view says otherwise)."""
    data = request.get_data()
    return parse_json_body(data, allowed) if data.strip() else {}


def _account(session: Session, account_id: int) -> Account:
    account = session.get(Account, account_id) if account_id <= MAX_ACCOUNT_ID else None
    if account is None:
        abort(404, description=f"no account {account_id}")
    return account


def _key(session: Session, prefix: str) -> ApiKey:
    row = find_key(session, prefix)
    if row is None:
        abort(404, description=f"no API key with prefix {prefix!r}")
    return row


@admin.errorhandler(InputError)
def _input_error(exc: InputError) -> Response:
    return error_response(400, "invalid_input", str(exc))


@admin.get("/accounts")
def accounts_list() -> Response:
    settings = app_settings()
    with session_factory(settings)() as session:
        return jsonify(accounts=[account_view(a, settings) for a in list_accounts(session)])


@admin.post("/accounts")
def accounts_create() -> tuple[Response, int]:
    settings = app_settings()
    body = _body(("name", "type", "is_admin", "key_name"))
    name = _name(body, "name", required=True)
    type_ = body.get("type", "standard")
    if type_ not in ACCOUNT_TYPES:
        raise InputError(f"'type' must be one of {', '.join(ACCOUNT_TYPES)}")
    is_admin = body.get("is_admin", False)
    if not isinstance(is_admin, bool):
        raise InputError("'is_admin' must be true or false")
    key_name = _name(body, "key_name", required=False)
    with session_factory(settings)() as session:
        try:
            account, key = create_account(
                session, name, type_, is_admin=is_admin, key_name=key_name
            )
            session.commit()
        except IntegrityError:
            session.rollback()
            return error_response(409, "conflict", f"an account named {name!r} exists"), 409
        row = find_key(session, key_prefix(key))
        return jsonify(account=account_view(account, settings), **_created_key(row, key)), 201


@admin.get(f"/accounts/{ACCOUNT_ID}")
def accounts_get(account_id: int) -> Response:
    settings = app_settings()
    with session_factory(settings)() as session:
        account = _account(session, account_id)
        return jsonify(account_view(account, settings, list_keys(session, account.id)))


@admin.patch(f"/accounts/{ACCOUNT_ID}")
def accounts_update(account_id: int) -> Response:
    settings = app_settings()
    body = _body(("type", "is_admin", "share_weight"))
    if "type" in body and body["type"] not in ACCOUNT_TYPES:
        raise InputError(f"'type' must be one of {', '.join(ACCOUNT_TYPES)}")
    if "is_admin" in body and not isinstance(body["is_admin"], bool):
        raise InputError("'is_admin' must be true or false")
    if "share_weight" in body:
        try:
            body["share_weight"] = share_weight(body["share_weight"])
        except ValueError as exc:
            raise InputError(str(exc)) from None
    with session_factory(settings)() as session:
        account = _account(session, account_id)
        # share_weight is read at the lanes' next refill: no restart, no cache to clear.
        for field in ("type", "is_admin", "share_weight"):
            if field in body:
                setattr(account, field, body[field])
        session.commit()
        return jsonify(account_view(account, settings, list_keys(session, account.id)))


@admin.get(f"/accounts/{ACCOUNT_ID}/keys")
def keys_list(account_id: int) -> Response:
    with session_factory(app_settings())() as session:
        account = _account(session, account_id)
        return jsonify(keys=[key_view(k) for k in list_keys(session, account.id)])


@admin.post(f"/accounts/{ACCOUNT_ID}/keys")
def keys_create(account_id: int) -> tuple[Response, int]:
    name = _name(_body(("name",)), "name", required=False)
    with session_factory(app_settings())() as session:
        row, key = add_api_key(session, _account(session, account_id), name)
        session.commit()
        return jsonify(_created_key(row, key)), 201


def _grace(body: dict[str, Any]) -> int:
    grace = body.get("grace_seconds", 0)
    if isinstance(grace, bool) or not isinstance(grace, int):
        raise InputError("'grace_seconds' must be an integer")
    if not 0 <= grace <= MAX_GRACE_SECONDS:
        raise InputError(f"'grace_seconds' must be between 0 and {MAX_GRACE_SECONDS}")
    return grace


@admin.post("/keys/<prefix>/rotate")
def keys_rotate(prefix: str) -> tuple[Response, int]:
    grace = _grace(_body(("grace_seconds",)))
    with session_factory(app_settings())() as session:
        old = _key(session, prefix)
        if not is_live(old):
            return error_response(409, "conflict", f"the key {prefix} is already revoked"), 409
        row, key = rotate_key(session, old, grace)
        session.commit()
        return jsonify(**_created_key(row, key), replaces=key_view(old)), 201


@admin.delete("/keys/<prefix>")
def keys_revoke(prefix: str) -> Response:
    with session_factory(app_settings())() as session:
        row = _key(session, prefix)
        revoke_key(session, row)
        session.commit()
        return jsonify(key_view(row))
