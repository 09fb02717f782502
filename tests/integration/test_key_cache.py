"""Trusted API keys in a real web app on the real Postgres: a key revoked by another
process stops within LANEWAY_AUTH_CACHE_SECONDS, one revoked through this process's admin
API at once, and the bound is the setting's (a clock of the test's own)."""

from __future__ import annotations

from sqlalchemy import update

from db.common import utcnow
from db.models import ApiKey
from db.session import session_scope
from tests.integration.conftest import auth
from webapp.keycache import KeyCache


class Clock:
    now = 50.0

    def __call__(self) -> float:
        return self.now


def _revoke_elsewhere(settings, key: str) -> None:
    """What `laneway accounts keys revoke` in another process does: the row, nothing else."""
    with session_scope(settings) as session:
        session.execute(update(ApiKey).where(ApiKey.prefix == key[:15]).values(revoked_at=utcnow()))


def test_a_key_revoked_by_another_process_stops_within_the_bound(app, settings, account_factory):
    clock = Clock()
    app.extensions["laneway_keys"] = KeyCache(2.0, clock)
    client = app.test_client()
    _, key = account_factory("trial")
    assert client.get("/v1/account", headers=auth(key)).status_code == 200
    _revoke_elsewhere(settings, key)
    clock.now += 1.9  # within the bound the process may still honour it
    assert client.get("/v1/account", headers=auth(key)).status_code == 200
    clock.now += 0.1  # at the bound it is looked up again: refused, with the JSON error
    refused = client.get("/v1/account", headers=auth(key))
    assert refused.status_code == 401 and "not valid" in refused.json["message"]


def test_with_the_cache_off_a_revocation_stops_the_key_on_the_next_request(
    app, settings, account_factory
):
    app.extensions["laneway_keys"] = KeyCache(0.0)
    client = app.test_client()
    _, key = account_factory("trial")
    assert client.get("/v1/account", headers=auth(key)).status_code == 200
    _revoke_elsewhere(settings, key)
    assert client.get("/v1/account", headers=auth(key)).status_code == 401


def test_the_default_app_trusts_a_key_for_the_settings_seconds(make_app):
    app = make_app(auth_cache_seconds=0.5)
    with app.app_context():
        from webapp.auth import key_cache

        assert key_cache().ttl == 0.5


def test_a_type_change_through_this_process_applies_at_once(app, account_factory):
    app.extensions["laneway_keys"] = KeyCache(60.0, Clock())
    client = app.test_client()
    _, admin_key = account_factory("standard", is_admin=True)
    account, key = account_factory("trial")
    assert client.get("/v1/account", headers=auth(key)).json["type"] == "trial"
    patched = client.patch(
        f"/v1/admin/accounts/{account.id}", json={"type": "demo"}, headers=auth(admin_key)
    )
    assert patched.status_code == 200
    assert client.get("/v1/account", headers=auth(key)).json["type"] == "demo"


def test_another_accounts_key_never_yields_this_accounts_data(app, account_factory):
    app.extensions["laneway_keys"] = KeyCache(60.0, Clock())
    client = app.test_client()
    first, first_key = account_factory("trial")
    second, second_key = account_factory("trial")
    for _ in range(3):  # cached copies of both keys, side by side
        assert client.get("/v1/account", headers=auth(first_key)).json["id"] == first.id
        assert client.get("/v1/account", headers=auth(second_key)).json["id"] == second.id
    # A key that only shares the prefix of a cached one is not that key.
    forged = first_key[:16] + "x" * (len(first_key) - 16)
    assert client.get("/v1/account", headers=auth(forged)).status_code == 401
