"""Accounts and API keys: the admin API and `laneway accounts ...`, on the real Postgres."""

from __future__ import annotations

import uuid

from click.testing import CliRunner
from sqlalchemy import select

from db.models import ApiKey
from db.session import session_scope
from fleet.cli import cli
from tests.integration.conftest import auth


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_account_endpoint_shows_type_limits_and_key_prefixes_only(client, account_factory):
    account, key = account_factory("trial")
    body = client.get("/v1/account", headers=auth(key)).json
    assert body["id"] == account.id and body["type"] == "trial" and body["is_admin"] is False
    assert body["limits"]["rate_limit"] == "300/minute" and body["limits"]["max_items"] == 1000
    assert body["key_prefix"] == key[:15] and [k["prefix"] for k in body["keys"]] == [key[:15]]
    assert key not in str(body)


def test_admin_creates_accounts_and_manages_their_keys(client, account_factory):
    _, admin_key = account_factory("standard", is_admin=True)
    admin = auth(admin_key)
    name = _name("acme")
    created = client.post(
        "/v1/admin/accounts",
        json={"name": name, "type": "enterprise", "key_name": "nightly"},
        headers=admin,
    )
    assert created.status_code == 201, created.json
    account, first = created.json["account"], created.json["key"]
    assert account["type"] == "enterprise" and created.json["name"] == "nightly"
    assert client.get("/v1/account", headers=auth(first)).json["name"] == name
    # The same name again is a conflict, not a 500.
    again = client.post("/v1/admin/accounts", json={"name": name}, headers=admin)
    assert again.status_code == 409 and again.json["error"] == "conflict"

    # A second key; both work.
    second = client.post(
        f"/v1/admin/accounts/{account['id']}/keys", json={"name": "ci"}, headers=admin
    )
    assert second.status_code == 201
    second_key = second.json["key"]
    assert client.get("/v1/account", headers=auth(second_key)).status_code == 200
    listed = client.get(f"/v1/admin/accounts/{account['id']}/keys", headers=admin).json["keys"]
    assert [(k["name"], k["live"]) for k in listed] == [("nightly", True), ("ci", True)]

    # Rotate with a grace period: old and new both work until it ends.
    rotated = client.post(
        f"/v1/admin/keys/{first[:15]}/rotate", json={"grace_seconds": 600}, headers=admin
    )
    assert rotated.status_code == 201 and rotated.json["name"] == "nightly"
    assert rotated.json["replaces"]["prefix"] == first[:15]
    assert rotated.json["replaces"]["revoked_at"] is not None
    assert client.get("/v1/account", headers=auth(first)).status_code == 200
    assert client.get("/v1/account", headers=auth(rotated.json["key"])).status_code == 200

    # Revoke: the key stops at once.
    revoked = client.delete(f"/v1/admin/keys/{first[:15]}", headers=admin)
    assert revoked.status_code == 200 and revoked.json["live"] is False
    assert client.get("/v1/account", headers=auth(first)).status_code == 401
    again = client.post(f"/v1/admin/keys/{first[:15]}/rotate", headers=admin)
    assert again.status_code == 409

    # Change the type: the limits follow.
    patched = client.patch(
        f"/v1/admin/accounts/{account['id']}", json={"type": "demo"}, headers=admin
    )
    assert patched.json["type"] == "demo" and patched.json["limits"]["max_items"] == 100
    names = [a["name"] for a in client.get("/v1/admin/accounts", headers=admin).json["accounts"]]
    assert name in names

    # Only hashes are stored.
    with session_scope() as session:
        hashes = session.scalars(select(ApiKey.key_hash)).all()
    assert not {first, second_key, rotated.json["key"]} & set(hashes)


def test_admin_endpoints_refuse_other_accounts_and_bad_input(client, account_factory):
    _, key = account_factory("enterprise")
    _, admin_key = account_factory(is_admin=True)
    for method, path in (
        ("get", "/v1/admin/accounts"),
        ("post", "/v1/admin/accounts"),
        ("get", "/v1/admin/accounts/1"),
        ("post", "/v1/admin/keys/lw_0123456789ab/rotate"),
        ("delete", "/v1/admin/keys/lw_0123456789ab"),
    ):
        assert getattr(client, method)(path).status_code == 401
        response = getattr(client, method)(path, headers=auth(key))
        assert response.status_code == 403 and response.json["error"] == "forbidden"

    admin = auth(admin_key)
    for body, message in (
        ({"type": "standard"}, "'name' must be a non-empty string"),
        ({"name": "x" * 101}, "longer than 100"),
        ({"name": "a\x00b"}, "NUL"),
        ({"name": "acme\nadmin  yes"}, "unprintable character ('\\n')"),  # a forged row
        ({"name": "   "}, "'name' must be a non-empty string"),
        ({"name": _name("t"), "key_name": "ops\r"}, "'key_name' contains an unprintable"),
        ({"name": _name("t"), "type": "gold"}, "'type' must be one of demo, trial"),
        ({"name": _name("t"), "is_admin": "yes"}, "'is_admin' must be true or false"),
        ({"name": _name("t"), "role": "admin"}, "unknown field 'role'"),
    ):
        response = client.post("/v1/admin/accounts", json=body, headers=admin)
        assert response.status_code == 400 and message in response.json["message"], body
    grace = client.post(
        "/v1/admin/keys/lw_0123456789ab/rotate", json={"grace_seconds": -1}, headers=admin
    )
    assert grace.status_code == 400 and "grace_seconds" in grace.json["message"]
    for path in (
        "/v1/admin/accounts/2147483647",
        "/v1/admin/accounts/99999999999999999999",
        "/v1/admin/keys/lw_0123456789ab",
        "/v1/admin/keys/nonsense%00",
    ):
        method = client.delete if "/keys/" in path else client.get
        assert method(path, headers=admin).status_code == 404, path


def _cli(*args: str) -> tuple[str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output + result.stderr
    return result.stdout, result.stderr


def test_cli_manages_accounts_and_keys(client):
    name = _name("cli")
    out, err = _cli("accounts", "create", name, "--type", "trial", "--admin", "--key-name", "ops")
    first = out.strip()
    assert first.startswith("lw_") and "shown once" in err and "admin" in err
    account = client.get("/v1/account", headers=auth(first)).json
    assert account["is_admin"] and account["type"] == "trial"

    out, _ = _cli("accounts", "list")
    assert any(name in line and "yes" in line for line in out.splitlines())

    second = _cli("accounts", "keys", "create", name, "--name", "batch")[0].strip()
    by_id = _cli("accounts", "keys", "create", str(account["id"]))[0].strip()
    assert len({first, second, by_id}) == 3
    rotated = _cli("accounts", "keys", "rotate", second[:15], "--grace", "300")[0].strip()
    _cli("accounts", "keys", "revoke", by_id[:15])
    out, _ = _cli("accounts", "keys", "list", name)
    assert first not in out and second not in out  # prefixes only, never keys
    states = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert states[first[:15]].endswith("live")
    assert "live until" in states[second[:15]] and "batch" in states[rotated[:15]]
    assert "revoked" in states[by_id[:15]]
    assert client.get("/v1/account", headers=auth(by_id)).status_code == 401
    assert client.get("/v1/account", headers=auth(second)).status_code == 200

    missing = CliRunner().invoke(cli, ["accounts", "keys", "revoke", "lw_nothere"])
    assert missing.exit_code != 0 and "no API key with prefix" in missing.output
    missing = CliRunner().invoke(cli, ["accounts", "keys", "list", "ghost-account"])
    assert missing.exit_code != 0 and "no account 'ghost-account'" in missing.output


def test_the_cli_takes_names_by_the_admin_api_s_rule(client):
    """A hurried operator's empty, blank, over-long or multi-line name (a newline would
    forge a row of `accounts list`): refused by name, exit 2, no account and no key made."""
    from db.models import Account

    settings = client.application.config["LANEWAY_SETTINGS"]
    owner = _name("names")
    _cli("accounts", "create", owner)
    with session_scope(settings) as session:
        before = (session.query(Account).count(), session.query(ApiKey).count())
    for argv, says in (
        (["accounts", "create", ""], "must be a non-empty string"),
        (["accounts", "create", "   "], "must be a non-empty string"),
        (["accounts", "create", "x" * 101], "longer than 100 characters"),
        (["accounts", "create", "acme\nadmin  yes"], "unprintable character ('\\n')"),
        (["accounts", "create", "a\u2028b"], "unprintable character"),
        (["accounts", "create", _name("k"), "--key-name", "\t"], "must be a non-empty string"),
        (["accounts", "create", _name("k"), "--key-name", "a\x1bb"], "unprintable"),
        (["accounts", "keys", "create", owner, "--name", "n\rx"], "unprintable"),
    ):
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 2 and says in result.output, (argv, result.output)
        assert "Traceback" not in result.output
    with session_scope(settings) as session:
        assert (session.query(Account).count(), session.query(ApiKey).count()) == before
    # Surrounding spaces are trimmed, as the API trims them.
    assert _cli("accounts", "create", f"  {owner}-spaced  ")[0].startswith("lw_")
    with session_scope(settings) as session:
        assert session.scalar(select(Account.name).where(Account.name == f"{owner}-spaced"))
