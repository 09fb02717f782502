"""Web pages: sign in with an API key, CSRF on every form, cookie flags, security headers."""

from __future__ import annotations

import io
import json
import re
import uuid

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


def _post(browser, path: str, data: dict, referrer: str = "/login", base: str = BASE):
    # Over HTTPS, browsers send the page's address (Referrer-Policy: same-origin) and
    # Flask-WTF checks it.
    headers = {"Referer": base + referrer}
    return browser.post(path, data=data, base_url=base, headers=headers)


def _login(browser, key: str, base: str = BASE):
    page = browser.get("/login", base_url=base)
    return _post(browser, "/login", {"csrf_token": _csrf(page.data), "api_key": key}, base=base)


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

    from webapp.security import secret_key

    home = settings.replace(home=tmp_path, secret_key="")
    first = secret_key(home)
    assert len(first) >= 32 and secret_key(home) == first
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600
    assert secret_key(home.replace(secret_key="x" * 40)) == "x" * 40


def test_a_second_process_never_sees_a_key_being_written(tmp_path, settings, monkeypatch):
    import secrets
    import threading

    from webapp.security import secret_key

    home = settings.replace(home=tmp_path, secret_key="")
    generate = secrets.token_urlsafe
    writing, finish = threading.Event(), threading.Event()

    def slow_first(n: int) -> str:
        if not writing.is_set():
            writing.set()
            finish.wait(10)
        return generate(n)

    monkeypatch.setattr(secrets, "token_urlsafe", slow_first)
    keys: dict[str, str] = {}
    first = threading.Thread(target=lambda: keys.update(first=secret_key(home)))
    first.start()
    assert writing.wait(10)
    # The first process is in the middle of making its key: the second gets a whole one at
    # once (no empty file to wait on), and the first ends up with the same.
    keys["second"] = secret_key(home)
    finish.set()
    first.join(10)
    assert len(keys["second"]) >= 32
    assert keys["first"] == keys["second"] == (tmp_path / "secret_key").read_text().strip()
    assert [p.name for p in tmp_path.iterdir()] == ["secret_key"]  # no temporary file left


# --- submit, jobs, a job, the dashboard ------------------------------------------------


def _signed_in(app, account_factory, type_: str = "standard"):
    browser = app.test_client()
    account, key = account_factory(type_)
    assert _login(browser, key).status_code == 303
    return browser, account


def _submit(browser, data: dict, ticked: bool = True):
    """Post the form as a browser would: classify is ticked unless the data says otherwise
    (or nothing is, with ticked=False)."""
    page = browser.get("/submit", base_url=BASE)
    assert page.status_code == 200
    data = {"csrf_token": _csrf(page.data), **({"tasks": ["classify"]} if ticked else {}), **data}
    return browser.post(
        "/submit",
        data=data,
        base_url=BASE,
        headers={"Referer": BASE + "/submit"},
        content_type="multipart/form-data",
    )


def _job_id(response) -> str:
    assert response.status_code == 303, response.data[:800]
    location = response.headers["Location"]
    assert location.startswith("/jobs/")
    return location.rsplit("/", 1)[1]


def _finish(job_id: str, n_failed: int = 0, letter: bool = False) -> None:
    """What workers would have written: every item's result (the last n_failed failed),
    the chunks done, a dead letter; then the job settles."""
    from sqlalchemy import select, update

    from db.models import Chunk, DeadLetter, JobItem
    from db.results import upsert_results
    from db.session import session_scope
    from jobs.lifecycle import settle

    key = uuid.UUID(job_id)
    with session_scope() as session:
        items = session.execute(
            select(JobItem.idx, JobItem.item_id).where(JobItem.job_id == key).order_by(JobItem.idx)
        ).all()
        rows = []
        for n, (idx, item_id) in enumerate(items):
            failed = n >= len(items) - n_failed
            output = {"label": "billing", "score": 0.5, "scores": {"billing": 0.5}}
            rows.append(
                {
                    "idx": idx,
                    "item_id": item_id,
                    "label": None if failed else "billing",
                    "output": None if failed else output,
                    "error": "model exploded" if failed else None,
                }
            )
        upsert_results(session, key, rows)
        session.execute(
            update(Chunk)
            .where(Chunk.job_id == key)
            .values(state="done", device="cpu", pre_seconds=0.01, model_seconds=0.2,
                    post_seconds=0.01, finished_at=func_now())
        )  # fmt: skip
        if letter:
            last = items[-1]
            session.add(
                DeadLetter(job_id=key, kind="item", idxs=[last.idx], item_ids=[last.item_id],
                           error="model exploded", traceback="Traceback ...", attempts=3)
            )  # fmt: skip
    settle(key)


def func_now():
    from db.common import utcnow

    return utcnow()


def test_pages_redirect_to_sign_in(browser):
    for path in ("/submit", "/jobs", "/dashboard", f"/jobs/{uuid.uuid4()}"):
        response = browser.get(path, base_url=BASE)
        assert response.status_code == 303 and response.headers["Location"] == "/login", path
    progress = browser.get(f"/jobs/{uuid.uuid4()}/progress", base_url=BASE)
    assert progress.status_code == 401 and progress.json["error"] == "unauthorized"


def test_submit_pasted_texts_then_watch_and_read_the_results(app, account_factory):
    browser, _ = _signed_in(app, account_factory)
    texts = "\n".join(f"message number {n}" for n in range(120))
    job_id = _job_id(_submit(browser, {"texts": texts, "tasks": ["classify", "score"],
                                       "labels": "billing, shipping"}))  # fmt: skip
    page = browser.get(f"/jobs/{job_id}", base_url=BASE)
    assert page.status_code == 200 and b'id="bar"' in page.data
    assert b"job.js" in page.data and b"<script>" not in page.data  # no inline script
    progress = browser.get(f"/jobs/{job_id}/progress", base_url=BASE).json
    assert progress["total"] == 120 and progress["final"] is False
    _finish(job_id, n_failed=2)
    done = browser.get(f"/jobs/{job_id}/progress", base_url=BASE).json
    assert done["final"] and done["percent"] == 100.0 and done["status"] == "partial"
    first = browser.get(f"/jobs/{job_id}", base_url=BASE)
    html = first.data.decode()
    assert "Results" in html and "page 1 of 3" in html and 'rel="next"' in html
    assert html.count('<td class="error">model exploded</td>') == 2  # failed items only
    last = browser.get(f"/jobs/{job_id}?page=3", base_url=BASE).data.decode()
    assert "page 3 of 3" in last and ">119<" in last and "model exploded" in last
    assert browser.get(f"/jobs/{job_id}?page=x", base_url=BASE).status_code == 200
    jsonl = browser.get(f"/jobs/{job_id}/results?format=jsonl", base_url=BASE)
    lines = [json.loads(x) for x in jsonl.data.decode().splitlines()]
    assert len(lines) == 120 and lines[0]["label"] == "billing"
    assert lines[-1] == {"id": "120", "error": "model exploded"}
    csv = browser.get(f"/jobs/{job_id}/results?format=csv", base_url=BASE)
    assert csv.mimetype == "text/csv" and csv.data.decode().splitlines()[0].startswith("id,label")
    assert browser.get(f"/jobs/{job_id}/results?format=xml", base_url=BASE).status_code == 400


def test_the_job_page_shows_each_items_text_beside_its_answer_escaped_and_shortened(
    app, account_factory
):
    browser, _ = _signed_in(app, account_factory)
    hostile = """<script>alert("owned")</script><img src=x onerror=alert(1)> & 'quoted'"""
    long = "refund " + "very " * 2000 + "THE-END"
    texts = [hostile, long, "where is my parcel?", "</td></tr></table><h1>broken</h1>"]
    job_id = _job_id(_submit(browser, {"texts": "\n".join(texts)}))
    _finish(job_id, n_failed=1)
    html = browser.get(f"/jobs/{job_id}", base_url=BASE).data.decode()
    results = re.search(r'<table class="results">.*?</table>', html, re.S).group(0)
    cells = re.findall(
        r'<td>(\d+)</td>\s*<td class="text">(.*?)</td>\s*<td>(.*?)</td>', results, re.S
    )
    assert [(n, label) for n, _, label in cells] == [
        ("1", "billing"), ("2", "billing"), ("3", "billing"), ("4", "")
    ]  # fmt: skip
    shown = {n: text for n, text, _ in cells}
    # Markup in a text is shown as text, never run or parsed.
    assert shown["1"] == (
        "&lt;script&gt;alert(&#34;owned&#34;)&lt;/script&gt;&lt;img src=x "
        "onerror=alert(1)&gt; &amp; &#39;quoted&#39;"
    )
    assert "<script>alert" not in html and "<img src=x" not in html and "<h1>broken" not in html
    assert shown["4"] == "&lt;/td&gt;&lt;/tr&gt;&lt;/table&gt;&lt;h1&gt;broken&lt;/h1&gt;"
    # A long text: its start, cut within 200 characters, an ellipsis; never its whole.
    assert shown["2"] == long[:199] + "\u2026" and "THE-END" not in html
    assert shown["3"] == "where is my parcel?"
    # The failed item's text is beside its error too.
    failed = re.search(r'<table class="failed">.*?</table>', html, re.S).group(0)
    assert '<td class="text">&lt;/td&gt;&lt;/tr&gt;' in failed and "model exploded" in failed


def test_the_job_page_says_how_many_items_failed_and_links_to_them_all(app, account_factory):
    browser, _ = _signed_in(app, account_factory)
    texts = "\n".join(f"message number {n}" for n in range(70))
    job_id = _job_id(_submit(browser, {"texts": texts}))
    _finish(job_id, n_failed=55)
    html = browser.get(f"/jobs/{job_id}", base_url=BASE).data.decode()
    shown = re.search(r'<table class="failed">.*?</table>', html, re.S).group(0)
    assert shown.count("model exploded") == 50  # the first 50 in the table
    assert "55 items failed; the first 50 are below" in html
    link = re.search(r'id="failed-csv" href="([^"]+)"', html).group(1).replace("&amp;", "&")
    failed_csv = browser.get(link, base_url=BASE)
    assert "-failed.csv" in failed_csv.headers["Content-Disposition"]
    rows = failed_csv.data.decode().splitlines()[1:]
    assert len(rows) == 55 and all(row.endswith("model exploded") for row in rows)
    link = re.search(r'id="failed-jsonl" href="([^"]+)"', html).group(1).replace("&amp;", "&")
    lines = [json.loads(x) for x in browser.get(link, base_url=BASE).data.decode().splitlines()]
    assert [x["id"] for x in lines] == [str(n) for n in range(16, 71)]
    bogus = browser.get(f"/jobs/{job_id}/results?format=csv&only=bogus", base_url=BASE)
    assert bogus.status_code == 400 and b"only=failed" in bogus.data


def test_an_upload_goes_through_the_streaming_path_and_bad_input_is_named(app, account_factory):
    browser, _ = _signed_in(app, account_factory)
    good = {"file": (io.BytesIO(b"id,text\na,hello there\nb,where is my parcel\n"), "in.csv")}
    job_id = _job_id(_submit(browser, good))
    assert browser.get(f"/jobs/{job_id}/progress", base_url=BASE).json["total"] == 2
    bad = {
        "file": (io.BytesIO(b'{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n'), "in.jsonl")
    }
    refused = _submit(browser, bad)
    assert refused.status_code == 400 and b"line 2: duplicate id" in refused.data
    empty = _submit(browser, {"texts": "  \n "})
    assert empty.status_code == 400 and b"paste at least one text" in empty.data
    wrong = _submit(browser, {"texts": "hi", "tasks": ["translate"]})
    assert wrong.status_code == 400 and b"is not a valid choice" in wrong.data
    # A form posts no checkbox at all when none is ticked.
    none = _submit(browser, {"texts": "hi", "labels": "a, b"}, ticked=False)
    assert none.status_code == 400 and b"non-empty list of task names" in none.data


def test_the_jobs_list_is_the_accounts_own_and_paged(app, account_factory):
    browser, _ = _signed_in(app, account_factory)
    other, _ = _signed_in(app, account_factory)
    theirs = _job_id(_submit(other, {"texts": "someone else's text"}))
    mine = [_job_id(_submit(browser, {"texts": f"text {n}"})) for n in range(27)]
    first = browser.get("/jobs", base_url=BASE).data.decode()
    assert mine[-1][:8] in first and mine[0][:8] not in first  # newest first
    assert theirs[:8] not in first and "page 1 of 2" in first
    second = browser.get("/jobs?page=2", base_url=BASE).data.decode()
    assert mine[0][:8] in second and theirs[:8] not in second


def test_retry_needs_the_csrf_token_and_sends_the_dead_letters_back(app, account_factory):
    browser, _ = _signed_in(app, account_factory)
    job_id = _job_id(_submit(browser, {"texts": "one\ntwo\nthree"}))
    _finish(job_id, n_failed=1, letter=True)
    page = browser.get(f"/jobs/{job_id}", base_url=BASE)
    html = page.data.decode()
    assert "Dead letters" in html and "Traceback" not in html and 'id="retry"' in html
    referer = {"Referer": f"{BASE}/jobs/{job_id}"}
    no_token = browser.post(f"/jobs/{job_id}/retry", base_url=BASE, headers=referer)
    assert no_token.status_code == 400 and b"CSRF token is missing" in no_token.data
    token = re.search(rb'/retry">\s*<input id="csrf_token" name="csrf_token" type="hidden" '
                      rb'value="([^"]+)"', page.data).group(1).decode()  # fmt: skip
    sent = browser.post(
        f"/jobs/{job_id}/retry", data={"csrf_token": token}, base_url=BASE, headers=referer
    )
    assert sent.status_code == 303 and sent.headers["Location"] == f"/jobs/{job_id}"
    after = browser.get(f"/jobs/{job_id}", base_url=BASE).data.decode()
    assert 'id="retry"' not in after  # the letter was sent back
    again = browser.post(
        f"/jobs/{job_id}/retry", data={"csrf_token": token}, base_url=BASE, headers=referer
    )
    assert again.status_code == 409 and b"no dead letters" in again.data


def test_the_dashboard_shows_lanes_workers_and_charts(app, account_factory):
    browser, _ = _signed_in(app, account_factory)
    job_id = _job_id(_submit(browser, {"texts": "a\nb\nc"}))
    _finish(job_id)
    html = browser.get("/dashboard", base_url=BASE).data.decode()
    for part in ("Lanes", "Workers", "<svg", "Items done per 5 minutes", "Dollars per item"):
        assert part in html, part
    assert job_id not in html  # fleet-wide figures, no account's jobs


def test_the_flower_link_follows_the_pages_scheme_unless_configured(app, make_app, account_factory):
    def flower_link(app, base_url: str) -> str:
        browser = app.test_client()
        assert _login(browser, account_factory()[1], base=base_url).status_code == 303
        html = browser.get("/dashboard", base_url=base_url).data.decode()
        return re.search(r'id="flower" href="([^"]+)"', html).group(1)

    assert flower_link(app, BASE) == "https://laneway.test:5555/"
    plain = make_app(secure_cookies=False, anonymous_rate_limit="100000/minute")
    assert flower_link(plain, "http://10.0.0.7:8000") == "http://10.0.0.7:5555/"
    assert flower_link(plain, "http://[::1]:8000") == "http://[::1]:5555/"
    linked = make_app(flower_url="https://flower.example/", anonymous_rate_limit="100000/minute")
    assert flower_link(linked, BASE) == "https://flower.example/"


def test_static_files_are_served_from_this_origin(client):
    script = client.get("/static/job.js")
    assert script.status_code == 200 and b"fetch(" in script.data
    assert client.get("/static/laneway.css").status_code == 200
    assert client.get("/static/nothing.js").status_code == 404


def test_a_form_part_without_a_name_is_refused_not_a_crash(browser):
    body = b'--b\r\nContent-Disposition: form-data; name="\n"\r\n\r\nnull\r\n--b--\r\n'
    for path in ("/submit", "/login"):
        response = browser.post(
            path, data=body, content_type="multipart/form-data; boundary=b", base_url=BASE
        )
        assert response.status_code == 400 and b"without a name" in response.data, path
