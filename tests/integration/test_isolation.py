"""No account reads another's data: every endpoint, called with another account's ids, is 404."""

from __future__ import annotations

import re

from tests.integration.conftest import auth, store_results

ITEMS = [{"id": "secret-1", "text": "the other account's private text"}]
# Arguments that name no account's data: every account reads the same served models.
SHARED_ARGUMENTS = {"model"}


def _fill(rule: str, values: dict[str, str]) -> str:
    """The rule's path with each <converter:name> replaced by values[name]."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1).rsplit(":", 1)[-1]
        assert name in values, f"{rule}: add a value for <{name}> to this test"
        return values[name]

    return re.sub(r"<([^>]+)>", one, rule)


def test_every_endpoint_answers_404_for_another_accounts_ids(app, client, account_factory):
    owner, owner_key = account_factory("enterprise")
    _, intruder_key = account_factory("enterprise", is_admin=False)
    job_id = client.post("/v1/jobs", json={"items": ITEMS}, headers=auth(owner_key)).json["id"]
    store_results(
        job_id, [{"idx": 0, "item_id": "secret-1", "label": "x", "output": {}, "error": None}]
    )
    # An asynchronous interactive request (no worker runs here: it stays PENDING).
    task_id = client.post(
        "/v1/inference", json={"task": "embed", "items": ITEMS}, headers=auth(owner_key)
    ).json["task_id"]
    owner_ids = {"job_id": job_id, "task_id": task_id}

    walked = []
    for rule in app.url_map.iter_rules():
        if not rule.arguments or rule.endpoint.startswith(("admin.", "pages.", "static")):
            # No ids to borrow; admin endpoints are for admins, pages sign in with a
            # session (both tested apart); static files belong to no one.
            continue
        if rule.arguments <= SHARED_ARGUMENTS:
            # The same answer for every account (checked below), so nothing to borrow.
            continue
        path = _fill(rule.rule, owner_ids)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            theirs = client.open(path, method=method, headers=auth(intruder_key))
            assert theirs.status_code == 404, (method, path, theirs.status_code)
            assert b"secret-1" not in theirs.data and b"private" not in theirs.data
            # The owner reaches the job (an action may still refuse, e.g. 409 for its state).
            mine = client.open(path, method=method, headers=auth(owner_key))
            assert mine.status_code != 404 and mine.status_code < 500, (method, path, mine)
            walked.append((method, rule.rule))
    # The walk reached the job endpoints (a route renamed away would make it vacuous).
    assert ("GET", "/v1/jobs/<job_id>") in walked
    assert ("GET", "/v1/jobs/<job_id>/results") in walked
    assert ("GET", "/v1/result/<task_id>") in walked
    # A served model reads the same for any account: it names nobody's data.
    mine = client.get("/v1/models/minilm", headers=auth(owner_key))
    theirs = client.get("/v1/models/minilm", headers=auth(intruder_key))
    assert mine.status_code == theirs.status_code == 200 and mine.json == theirs.json
    # Variants: the CSV download, and a HEAD.
    csv_path = f"/v1/jobs/{job_id}/results?format=csv"
    assert client.get(csv_path, headers=auth(intruder_key)).status_code == 404
    assert client.head(f"/v1/jobs/{job_id}", headers=auth(intruder_key)).status_code == 404


def test_an_admin_sees_accounts_but_not_other_accounts_jobs(client, account_factory):
    _, owner_key = account_factory()
    _, admin_key = account_factory(is_admin=True)
    job_id = client.post("/v1/jobs", json={"items": ITEMS}, headers=auth(owner_key)).json["id"]
    assert client.get(f"/v1/jobs/{job_id}", headers=auth(admin_key)).status_code == 404
    assert client.get(f"/v1/jobs/{job_id}/results", headers=auth(admin_key)).status_code == 404


def test_every_page_answers_404_for_another_accounts_job(app, client, account_factory):
    """The same walk through the web pages, signed in as each account in turn (with each
    one's own CSRF token for the forms)."""
    from tests.integration.test_pages import BASE, _csrf, _login

    _, owner_key = account_factory("enterprise")
    _, intruder_key = account_factory("enterprise")
    job_id = client.post("/v1/jobs", json={"items": ITEMS}, headers=auth(owner_key)).json["id"]
    store_results(
        job_id, [{"idx": 0, "item_id": "secret-1", "label": "x", "output": {}, "error": None}]
    )
    browsers = {}
    for who, key in (("owner", owner_key), ("intruder", intruder_key)):
        browsers[who] = app.test_client()
        assert _login(browsers[who], key).status_code == 303
    tokens = {who: _csrf(b.get("/submit", base_url=BASE).data) for who, b in browsers.items()}

    walked = []
    for rule in app.url_map.iter_rules():
        if not rule.arguments or not rule.endpoint.startswith("pages."):
            continue
        path = _fill(rule.rule, {"job_id": job_id})
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            answers = {}
            for who, browser in browsers.items():
                answers[who] = browser.open(
                    path,
                    method=method,
                    base_url=BASE,
                    data={"csrf_token": tokens[who]} if method == "POST" else None,
                    headers={"Referer": BASE + "/"},
                )
            theirs, mine = answers["intruder"], answers["owner"]
            assert theirs.status_code == 404, (method, path, theirs.status_code)
            assert b"secret-1" not in theirs.data and b"private" not in theirs.data
            assert mine.status_code != 404 and mine.status_code < 500, (method, path, mine)
            walked.append((method, rule.rule))
    for route in (
        ("GET", "/jobs/<job_id>"),
        ("GET", "/jobs/<job_id>/progress"),
        ("GET", "/jobs/<job_id>/results"),
        ("POST", "/jobs/<job_id>/retry"),
    ):
        assert route in walked, route
    # Nor does the job list or the dashboard name another account's job.
    for page in ("/jobs", "/dashboard"):
        html = browsers["intruder"].get(page, base_url=BASE).data
        assert job_id[:8].encode() not in html and b"secret-1" not in html
