"""Signing out ends a web sign-in on every copy of its cookie, and a sign-in ends after
LANEWAY_SESSION_LIFETIME however active; API keys are unaffected. Real Redis and Postgres."""

from __future__ import annotations

import time

import pytest
import redis

from tests.integration.conftest import auth
from tests.integration.test_pages import BASE, _csrf, _login, _post
from webapp.sessions import PREFIX


def _cookie(browser) -> str:
    return browser.get_cookie("laneway_session", domain="laneway.test").value


def _replay(app, cookie: str):
    """A second browser (the attacker's) with a copied cookie."""
    thief = app.test_client()
    thief.set_cookie("laneway_session", cookie, domain="laneway.test")
    return thief


def _signed_in(client) -> bool:
    response = client.get("/", base_url=BASE)
    if response.status_code == 303:
        assert response.headers["Location"] == "/login"
        return False
    assert response.status_code == 200
    return True


def _sign_out(browser) -> None:
    home = browser.get("/", base_url=BASE)
    out = _post(browser, "/logout", {"csrf_token": _csrf(home.data)}, "/")
    assert out.status_code == 303


def test_a_cookie_copied_before_sign_out_is_refused_after_it(app, account_factory, settings):
    _, key = account_factory()
    browser = app.test_client()
    assert _login(browser, key).status_code == 303
    copied = _cookie(browser)
    thief = _replay(app, copied)
    assert _signed_in(thief)  # the copy works while the sign-in lasts
    r = redis.Redis.from_url(settings.redis_url)
    records = set(r.keys(PREFIX + "*"))
    _sign_out(browser)
    assert len(records - set(r.keys(PREFIX + "*"))) == 1  # its record, deleted
    assert not _signed_in(browser)
    assert not _signed_in(_replay(app, copied))
    # The progress endpoint and every other page refuse it too.
    progress = _replay(app, copied).get("/jobs/00000000-0000-0000-0000-000000000000/progress")
    assert progress.status_code == 401
    # Signing in again is a new sign-in: the old copy stays dead.
    assert _login(browser, key).status_code == 303
    assert _signed_in(browser) and not _signed_in(_replay(app, copied))
    # The API key itself works as before.
    assert app.test_client().get("/v1/account", headers=auth(key)).status_code == 200


def test_sign_out_deletes_only_its_own_sign_in(app, account_factory, settings):
    _, key = account_factory()
    laptop, phone = app.test_client(), app.test_client()
    assert _login(laptop, key).status_code == 303
    assert _login(phone, key).status_code == 303
    _sign_out(laptop)
    assert not _signed_in(laptop) and _signed_in(phone)


def test_a_sign_in_older_than_the_lifetime_is_refused(make_app, account_factory):
    app = make_app(anonymous_rate_limit="100000/minute", session_lifetime=3600)
    _, key = account_factory()
    browser = app.test_client()
    assert _login(browser, key).status_code == 303
    cookie = browser.get_cookie("laneway_session", domain="laneway.test")
    assert cookie.max_age == 3600 or cookie.expires is not None
    # The same sign-in (its record still in Redis), begun longer ago than the lifetime.
    with browser.session_transaction(base_url=BASE) as s:
        s["at"] = int(time.time()) - 3601
    assert not _signed_in(browser)
    with browser.session_transaction(base_url=BASE) as s:
        s["at"] = int(time.time()) - 3500
    assert _signed_in(browser)
    # Nor may a cookie claim a start in the future to last longer.
    with browser.session_transaction(base_url=BASE) as s:
        s["at"] = int(time.time()) + 86400
    assert not _signed_in(browser)
    assert app.test_client().get("/v1/account", headers=auth(key)).status_code == 200


def test_the_record_expires_with_the_lifetime(make_app, account_factory, settings):
    app = make_app(anonymous_rate_limit="100000/minute", session_lifetime=600)
    _, key = account_factory()
    r = redis.Redis.from_url(settings.redis_url)
    before = set(r.keys(PREFIX + "*"))
    assert _login(app.test_client(), key).status_code == 303
    (record,) = set(r.keys(PREFIX + "*")) - before
    assert 0 < r.ttl(record) <= 600
    r.delete(record)  # gone (expired, or Redis flushed): the sign-in is over


@pytest.mark.parametrize(
    "forged",
    [
        {"key_id": 1},  # a cookie from before sign-in records: no record to check
        {"key_id": 1, "sid": "guessed", "at": 0},
        {"key_id": "1", "sid": "guessed", "at": "now"},
    ],
)
def test_a_session_without_a_live_record_is_signed_out(app, forged):
    browser = app.test_client()
    with browser.session_transaction(base_url=BASE) as s:
        s.update({**forged, "at": int(time.time())} if "sid" in forged else forged)
    assert not _signed_in(browser)


def test_redis_unreachable_is_signed_out_not_a_crash(make_app, account_factory):
    _, key = account_factory()
    app = make_app(anonymous_rate_limit="100000/minute")
    browser = app.test_client()
    assert _login(browser, key).status_code == 303
    cookie = _cookie(browser)
    down = make_app(anonymous_rate_limit="100000/minute", redis_url="redis://127.0.0.1:1/0")
    assert not _signed_in(_replay(down, cookie))
    assert _login(down.test_client(), key).status_code == 503


def test_an_api_call_neither_reads_nor_refreshes_the_pages_cookie(app, account_factory):
    """The bearer APIs skip the session: a browser's cookie sent along with an API call is
    not opened (no account from it) and the answer sets no cookie, while a page refreshes it."""
    _, key = account_factory()
    browser = app.test_client()
    assert _login(browser, key).status_code == 303
    page = browser.get("/", base_url=BASE)
    assert page.status_code == 200 and "laneway_session" in page.headers.get("Set-Cookie", "")
    for headers in ({}, auth(key)):
        api = browser.get("/v1/jobs", base_url=BASE, headers=headers)
        assert api.status_code == (200 if headers else 401), api.json
        assert "Set-Cookie" not in api.headers
    assert _signed_in(browser)  # the pages' sign-in stands


def test_the_bearer_blueprints_and_only_they_live_under_the_api_path(app):
    """PagesOnlySessions tells API calls by their path: every route under it is a bearer
    blueprint's, and every bearer blueprint's route is under it."""
    from webapp.auth import BEARER_BLUEPRINTS
    from webapp.security import BEARER_PATHS

    rules = list(app.url_map.iter_rules())
    assert rules
    for rule in rules:
        blueprint = rule.endpoint.rpartition(".")[0]
        assert rule.rule.startswith(BEARER_PATHS) == (blueprint in BEARER_BLUEPRINTS), rule
