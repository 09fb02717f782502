"""Web pages: sign in with an API key, CSRF on every form, cookie flags, security headers."""

from __future__ import annotations

import re

import pytest

from tests.integration.conftest import auth

BASE = "https://laneway.test"  # secure cookies travel over HTTPS only


def _csrf(html: bytes) -> str:
    match = re.search(rb'name="csrf_token" type="hidden" value="([^"]+)"', html)
    assert match, html[:500]
    return match.group(1).decode()


@pytest.fixture
def browser(app):
    return app.test_client()


def _post(browser, path: str, data: dict, referrer: str = "/login"):
    # Over HTTPS, browsers send the page's address (Referrer-Policy: same-origin) and
    # Flask-WTF checks it.
    headers = {"Referer": BASE + referrer}
    return browser.post(path, data=data, base_url=BASE, headers=headers)


def _login(browser, key: str):
    page = browser.get("/login", base_url=BASE)
    return _post(browser, "/login", {"csrf_token": _csrf(page.data), "api_key": key})


def test_sign_in_sign_out_with_a_signed_secure_session(browser, account_factory):
    account, key = account_factory("trial")
    assert browser.get("/", base_url=BASE).headers["Location"] == "/login"

    response = _login(browser, key)
    assert response.status_code == 303 and response.headers["Location"] == "/"
    cookie = response.headers["Set-Cookie"]
    assert cookie.startswith("laneway_session=")
    for flag in ("Secure", "HttpOnly", "SameSite=Lax"):
        assert flag in cookie
    assert key not in cookie and key[:15] not in cookie

    home = browser.get("/", base_url=BASE)
    assert home.status_code == 200 and account.name.encode() in home.data
    assert key[:15].encode() in home.data and key.encode() not in home.data
    assert home.headers["Cache-Control"] == "no-store"

    # Signing out needs the form's token too: another site cannot sign a user out.
    assert _post(browser, "/logout", {}, "/").status_code == 400
    out = _post(browser, "/logout", {"csrf_token": _csrf(home.data)}, "/")
    assert out.status_code == 303 and out.headers["Location"] == "/login"
    assert browser.get("/", base_url=BASE).headers["Location"] == "/login"


def test_login_without_the_csrf_token_is_refused(browser, account_factory):
    _, key = account_factory()
    page = browser.get("/login", base_url=BASE)
    response = _post(browser, "/login", {"api_key": key})
    assert response.status_code == 400 and b"CSRF token is missing" in response.data
    forged = _post(browser, "/login", {"api_key": key, "csrf_token": "forged"})
    assert forged.status_code == 400 and b"CSRF token is invalid" in forged.data
    # A real token posted from another site's page is refused too.
    elsewhere = browser.post(
        "/login",
        data={"api_key": key, "csrf_token": _csrf(page.data)},
        base_url=BASE,
        headers={"Referer": "https://evil.test/"},
    )
    assert elsewhere.status_code == 400 and b"referrer does not match" in elsewhere.data
    assert browser.get("/", base_url=BASE).status_code == 303


def test_a_wrong_key_is_refused_and_a_revoked_key_ends_the_session(
    browser, client, account_factory
):
    _, admin_key = account_factory(is_admin=True)
    _, key = account_factory()
    wrong = _login(browser, key[:-2] + "zz")
    assert wrong.status_code == 401 and b"not valid" in wrong.data
    assert key[15:-2].encode() not in wrong.data  # the form never echoes the key
    assert _login(browser, "lw_\x00_x").status_code == 401  # not a database error
    assert _login(browser, key).status_code == 303
    assert browser.get("/", base_url=BASE).status_code == 200
    client.delete(f"/v1/admin/keys/{key[:15]}", headers=auth(admin_key))
    assert browser.get("/", base_url=BASE).headers["Location"] == "/login"


def test_the_session_cookie_is_not_secure_when_configured_for_plain_http(make_app, account_factory):
    _, key = account_factory()
    browser = make_app(secure_cookies=False).test_client()
    response = _login(browser, key)  # over https here, but the flag follows the setting
    assert response.status_code == 303 and "Secure" not in response.headers["Set-Cookie"]


@pytest.mark.parametrize("path", ["/login", "/healthz", "/v1/account", "/nothing", "/openapi.json"])
def test_every_response_carries_the_security_headers(client, path):
    headers = client.get(path).headers
    csp = headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "http" not in csp  # no external source
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["Referrer-Policy"] == "same-origin"


def test_the_json_api_needs_no_csrf_token_and_ignores_the_session(browser, account_factory):
    _, key = account_factory()
    assert _login(browser, key).status_code == 303
    # A signed-in browser's cookie is not an API credential: no bearer key, no answer.
    assert browser.get("/v1/account", base_url=BASE).status_code == 401
    response = browser.post(
        "/v1/jobs",
        json={"items": [{"id": "1", "text": "hello"}]},
        headers=auth(key),
        base_url=BASE,
    )
    assert response.status_code == 202


def test_the_secret_key_is_generated_once_and_kept(tmp_path, settings):
    import dataclasses

    from webapp.security import secret_key

    home = dataclasses.replace(settings, home=tmp_path, secret_key="")
    first = secret_key(home)
    assert len(first) >= 32 and secret_key(home) == first
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600
    assert secret_key(dataclasses.replace(home, secret_key="x" * 40)) == "x" * 40
