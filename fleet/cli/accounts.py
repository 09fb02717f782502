"""`laneway db` and `laneway accounts`: the schema, accounts and their API keys (read and
written in the database directly: the operator's commands, not the API's)."""

from __future__ import annotations

from typing import Any

import click

from core.vocab import ACCOUNT_TYPES
from fleet.cli.common import cli_settings, json_option, table


@click.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Migrate the database to the newest schema."""
    from db.migrate import upgrade

    settings = cli_settings()
    upgrade(settings, revision=revision)
    click.echo(f"database at {revision}: {_safe_url(settings.database_url)}")


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@click.group()
def accounts() -> None:
    """Accounts and their API keys."""


def _name(_ctx: Any, _param: Any, value: str | None) -> str | None:
    """An account's or a key's name, by the admin API's rule (jobs/inputs.py)."""
    if value is None:
        return None
    from jobs.inputs import InputError, parse_name

    try:
        return parse_name(value, "the name")
    except InputError as exc:
        raise click.BadParameter(str(exc)) from None


def _webhook_url(_ctx: Any, _param: Any, value: str | None) -> str | None:
    """An http(s) URL with a host. Echoed nowhere: it may carry a secret token."""
    if value is None:
        return None
    import httpx

    try:
        url = httpx.URL(value)
    except httpx.InvalidURL:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host or len(value) > 2000:
        raise click.BadParameter(
            "must be an http:// or https:// URL with a host (2000 chars at most)"
        )
    return value


@accounts.command("create")
@click.argument("name", callback=_name)
@click.option("--type", "type_", type=click.Choice(ACCOUNT_TYPES), default="standard")
@click.option("--admin", is_flag=True, help="may manage every account and key (/v1/admin)")
@click.option("--key-name", default=None, callback=_name, help="a name for its first API key")
@click.option("--webhook", default=None, callback=_webhook_url, help="told when inbox jobs end")
def accounts_create(
    name: str, type_: str, admin: bool, key_name: str | None, webhook: str | None
) -> None:
    """Create an account; prints its API key once, on its own line."""
    from sqlalchemy.exc import IntegrityError

    from db.accounts import create_account
    from db.session import session_scope

    try:
        with session_scope(cli_settings()) as session:
            account, key = create_account(session, name, type_, is_admin=admin, key_name=key_name)
            account.webhook_url = webhook
    except IntegrityError:
        raise click.ClickException(f"an account named {name!r} already exists") from None
    role = " admin" if admin else ""
    click.echo(f"created {type_}{role} account {name!r}; its API key (shown once):", err=True)
    click.echo(key)


@accounts.command("list")
@json_option
def accounts_list(as_json: bool) -> None:
    """List accounts: id, name, type, admin, fair-share weight in effect (with "(type)"
    where it is the type's), live keys."""
    from db.accounts import is_live, list_accounts, list_keys, share_weight_in_effect
    from db.session import session_scope

    settings = cli_settings()
    rows = []
    with session_scope(settings) as session:
        for account in list_accounts(session):
            weight, is_default = share_weight_in_effect(account, settings)
            rows.append(
                {
                    "id": account.id,
                    "name": account.name,
                    "type": account.type,
                    "admin": account.is_admin,
                    "weight": weight,
                    "weight_is_default": is_default,
                    "live_keys": sum(is_live(k) for k in list_keys(session, account.id)),
                }
            )
    if not as_json:
        rows = [
            {
                **row,
                "admin": "yes" if row["admin"] else "",
                "weight": f"{row['weight']:g}" + (" (type)" if row["weight_is_default"] else ""),
            }
            for row in rows
        ]
    columns = (
        ("id", 6), ("name", 30), ("type", 10), ("admin", 5), ("weight", 12), ("live_keys", 0),
    )  # fmt: skip
    table(rows, columns, as_json)


@accounts.group("keys")
def keys() -> None:
    """An account's API keys: create, list, rotate, revoke (keys are named by prefix)."""


def _find_account(session: Any, ref: str) -> Any:
    from db.accounts import find_account

    account = find_account(session, ref)
    if account is None:
        raise click.ClickException(f"no account {ref!r} (give its name or id)")
    return account


def _find_key(session: Any, prefix: str) -> Any:
    from db.accounts import find_key

    row = find_key(session, prefix)
    if row is None:
        raise click.ClickException(f"no API key with prefix {prefix!r} (e.g. lw_0123456789ab)")
    return row


def _print_key(key: str) -> None:
    click.echo("the new API key (shown once):", err=True)
    click.echo(key)


@keys.command("create")
@click.argument("account")
@click.option(
    "--name", default=None, callback=_name, help="what the key is for, e.g. nightly-upload"
)
def keys_create(account: str, name: str | None) -> None:
    """Add an API key to ACCOUNT (name or id); prints it once."""
    from db.accounts import add_api_key
    from db.session import session_scope

    with session_scope(cli_settings()) as session:
        _, key = add_api_key(session, _find_account(session, account), name)
    _print_key(key)


@keys.command("list")
@click.argument("account")
@json_option
def keys_list(account: str, as_json: bool) -> None:
    """List ACCOUNT's keys by prefix (the keys themselves are never stored)."""
    from db.accounts import is_live, list_keys
    from db.common import aware
    from db.session import session_scope

    rows = []
    with session_scope(cli_settings()) as session:
        for row in list_keys(session, _find_account(session, account).id):
            if row.revoked_at is None:
                state = "live"
            else:
                when = aware(row.revoked_at).isoformat(timespec="seconds")
                state = f"live until {when}" if is_live(row) else f"revoked {when}"
            created = aware(row.created_at).isoformat(timespec="seconds")
            rows.append({"prefix": row.prefix, "name": row.name or "", "created": created,
                         "state": state})  # fmt: skip
    table(rows, (("prefix", 16), ("name", 24), ("created", 25), ("state", 0)), as_json)


@keys.command("rotate")
@click.argument("prefix")
@click.option(
    "--grace", default=0, show_default=True, type=click.IntRange(0, 30 * 24 * 3600),
    help="seconds the old key keeps working",
)  # fmt: skip
def keys_rotate(prefix: str, grace: int) -> None:
    """Replace the key PREFIX with a new one; the old one stops after --grace seconds."""
    from db.accounts import is_live, rotate_key
    from db.session import session_scope

    with session_scope(cli_settings()) as session:
        row = _find_key(session, prefix)
        if not is_live(row):
            raise click.ClickException(f"the key {prefix} is already revoked")
        _, key = rotate_key(session, row, grace)
    _print_key(key)


@keys.command("revoke")
@click.argument("prefix")
def keys_revoke(prefix: str) -> None:
    """Revoke the key PREFIX now."""
    from db.accounts import revoke_key
    from db.session import session_scope

    with session_scope(cli_settings()) as session:
        revoke_key(session, _find_key(session, prefix))
    click.echo(f"revoked {prefix}")


@accounts.command("webhook")
@click.argument("name")
@click.argument("url", required=False, callback=_webhook_url)
@click.option("--clear", is_flag=True, help="remove the account's webhook")
def accounts_webhook(name: str, url: str | None, clear: bool) -> None:
    """Set (or --clear) the URL told when the account's inbox jobs reach the outbox."""
    from sqlalchemy import select

    from db.models import Account
    from db.session import session_scope

    if (url is None) != clear:
        raise click.UsageError("give a URL, or --clear")
    with session_scope(cli_settings()) as session:
        account = session.scalar(select(Account).where(Account.name == name))
        if account is None:
            raise click.ClickException(f"no account named {name!r}")
        account.webhook_url = url
    click.echo(f"webhook {'cleared' if clear else 'set'} for account {name!r}")


# A negative WEIGHT is read as the argument it is (and refused as a weight), not as an option.
@accounts.command("weight", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("weight", required=False)
@click.option("--clear", is_flag=True, help="back to the account type's weight")
def accounts_weight(name: str, weight: str | None, clear: bool) -> None:
    """Set NAME's weight in its lanes' fair share: WEIGHT (a number from 0.001 to 1000), or
    `default` (or --clear) for its type's (LANEWAY_SHARE_WEIGHT_<TYPE>). The lanes read it at
    their next refill: nothing restarts."""
    from db.accounts import share_weight
    from db.session import session_scope

    if clear == (weight is not None):
        raise click.UsageError("give a WEIGHT (or default), or --clear")
    if clear or weight == "default":
        wanted = None
    else:
        try:
            wanted = share_weight(float(weight))  # type: ignore[arg-type]
        except ValueError:
            raise click.ClickException(
                f"{weight!r} is no weight: a number from 0.001 to 1000, or default"
            ) from None
    with session_scope(cli_settings()) as session:
        account = _find_account(session, name)
        account.share_weight = wanted
        label = account.name
    shown = "its type's" if wanted is None else f"{wanted:g}"
    click.echo(f"account {label!r} now weighs {shown} in its lanes' fair share")
