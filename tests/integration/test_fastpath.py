"""The plain synchronous request answered beneath Flask (webapp/fastpath.py), through a real
interactive worker on the run's Redis: the same answer as the Flask view gives, and every
case that is not plain handed to the app before anything counts, or, once counted, handed
on so that it is counted once, queued once and never lost."""

from __future__ import annotations

import uuid

import pytest
import redis

from core.store.interactive_protocol import requests_key
from db.accounts import revoke_key
from db.models import ApiKey
from db.session import session_scope
from tests.e2e.procs import interactive_worker
from tests.integration.conftest import auth
from tests.integration.test_rate_gate import COSTLY, JSON, embed, jobs_of, limited, remaining

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def worker(tmp_path_factory, settings, migrated):
    logdir = tmp_path_factory.mktemp("fastpath")
    with interactive_worker(settings, logdir, "fastpath-it", {"LANEWAY_CACHE_TTL": "300"}) as proc:
        yield proc


class Counted:
    """The app's own WSGI callable, counting the requests the fast path handed to it."""

    def __init__(self, app) -> None:
        self.fast = app.wsgi_app
        self.inner, self.calls = self.fast.inner, 0
        self.fast.inner = self

    def __call__(self, environ, start_response):
        self.calls += 1
        return self.inner(environ, start_response)


def fast_client(app, account_factory):
    """The app's test client through the fast path, the counter of what it handed to the
    app, and a trial account with its key."""
    counted = Counted(app)
    account, key = account_factory("trial")
    return app.test_client(), counted, account, key


def flask_only(app):
    """A client of the same app without the fast path: the Flask view answers everything."""
    app.wsgi_app = app.wsgi_app.inner
    return app.test_client()


def test_the_fast_answer_is_the_flask_answer(worker, make_app, settings, account_factory):
    fast_app = limited(make_app, settings, "50/minute")
    counted = Counted(fast_app)
    fast, slow = fast_app.test_client(), flask_only(limited(make_app, settings, "50/minute"))
    _, key = account_factory("trial")
    t = uuid.uuid4().hex[:8]
    for task, extra in (("embed", {}), ("classify", {"labels": ["billing", "shipping"]})):
        a = fast.post(f"/v1/{task}", json={"items": [{"id": "1", "text": f"a {t}"}], **extra},
                      headers=auth(key))  # fmt: skip
        b = slow.post(f"/v1/{task}", json={"items": [{"id": "1", "text": f"b {t}"}], **extra},
                      headers=auth(key))  # fmt: skip
        assert a.status_code == b.status_code == 200, (a.json, b.json)
        assert set(a.json) == set(b.json) and a.json["cached"] is b.json["cached"] is False
        assert a.json["lane"] == b.json["lane"] and a.json["task"] == b.json["task"] == task
        assert [set(r) for r in a.json["results"]] == [set(r) for r in b.json["results"]]
        skip = {"Date", "Content-Length"}
        assert {h for h in a.headers.keys() if h not in skip} == {
            h for h in b.headers.keys() if h not in skip
        }
        for name in ("Content-Type", "RateLimit-Limit", "RateLimit-Policy", "X-RateLimit-Limit",
                     "Content-Security-Policy", "X-Frame-Options", "Referrer-Policy"):  # fmt: skip
            assert a.headers[name] == b.headers[name], name
        assert remaining(b) == remaining(a) - 1  # one budget, counted once each
        assert [s.split(";")[0] for s in a.headers["Server-Timing"].split(", ")] == [
            s.split(";")[0] for s in b.headers["Server-Timing"].split(", ")
        ]
    assert counted.calls == 0


def test_what_is_not_plain_goes_to_the_app_before_anything_counts(
    worker, make_app, settings, account_factory
):
    app = limited(make_app, settings, "50/minute")
    client, counted, account, key = fast_client(app, account_factory)
    t = uuid.uuid4().hex[:8]
    assert remaining(embed(client, key, f"first {t}")) == 49 and counted.calls == 0
    cases = [
        (lambda: client.post("/v1/embed", json={"items": "x"}, headers=auth(key)), 400),
        (lambda: client.post("/v1/embed", data="{}", headers=auth(key)), 415),
        (lambda: client.post("/v1/embed", data=COSTLY, headers={**auth(key), **JSON}), 413),
        (lambda: embed(client, key, f"first {t}"), 200),  # cached
        (lambda: embed(client, key, f"prefer {t}", headers={"Prefer": "wait=5"}), 200),
    ]
    from tests.integration.test_interactive import wait_stored

    wait_stored(settings, account.id, [f"first {t}"])
    for n, (call, status) in enumerate(cases, start=1):
        response = call()
        assert response.status_code == status, (n, response.json)
        assert remaining(response) == 49 - n, n  # counted once, by the app
        assert counted.calls == n, n
    # No key, or a key that is not one: the app's 401 (and its count per address).
    anonymous = client.post("/v1/embed", json={"items": [{"id": "1", "text": "x"}]})
    bad = client.post("/v1/embed", json={"items": [{"id": "1", "text": "x"}]},
                      headers=auth("lw_0123456789ab_guess"))  # fmt: skip
    assert anonymous.status_code == bad.status_code == 401
    # A key revoked a moment ago: the same key cache as the app's, the same answer.
    with session_scope(settings) as s:
        revoke_key(s, s.query(ApiKey).filter_by(account_id=account.id).one())
    from webapp.auth import key_cache

    key_cache(app).clear()
    assert embed(client, key, f"revoked {t}").status_code == 401


def test_a_refusal_and_a_missed_answer_are_counted_once_and_never_lost(
    worker, make_app, settings, account_factory
):
    # The gpu lane has no worker here: what is queued there waits, unanswered.
    app = limited(make_app, settings, "3/minute", interactive_lane="gpu", sync_timeout=1.0)
    client, counted, account, key = fast_client(app, account_factory)
    r = redis.Redis.from_url(settings.redis_url)
    queued = r.llen(requests_key("gpu"))
    missed = embed(client, key, f"missed {uuid.uuid4().hex}")
    assert missed.status_code == 202, missed.json  # stored as a job by the app
    assert remaining(missed) == 2 and counted.calls == 1
    assert r.llen(requests_key("gpu")) == queued + 1  # queued once, by the fast path
    assert jobs_of(account.id) == 1
    for _ in range(2):
        embed(client, key, f"more {uuid.uuid4().hex}")
    queued = r.llen(requests_key("gpu"))
    refused = embed(client, key, f"refused {uuid.uuid4().hex}")
    assert refused.status_code == 429 and remaining(refused) == 0
    assert r.llen(requests_key("gpu")) == queued  # refused twice over, queued never
    assert jobs_of(account.id) == 3


def test_hostile_small_bodies_get_the_apps_refusal_and_count_once(
    worker, make_app, settings, account_factory
):
    client, counted, _, key = fast_client(limited(make_app, settings, "50/minute"), account_factory)
    bodies = [
        b'{"items": ' + b"[" * 30000 + b"]" * 30000 + b"}",  # nesting past the parser's depth
        b'{"items": [' + b",".join(b'{"id": "%d", "text": "x"}' % n for n in range(2000)) + b"]}",
        b'{"items": [{"id": "1", "text": "' + b"a" * 60000 + b'"}]}',  # past the text limit
        b'{"items": [{"id": "1", "text": "a"}, {"id": "1", "text": "b"}]}',  # a repeated id
        b'{"items": [{"id": "1", "text": "a"}], "tasks": ["embed"]}',  # a field not taken
        b'{"items": [{"id": "1", "text": "a"}]',  # cut short
        b"\xff\xfe{}",  # not UTF-8
    ]
    for n, body in enumerate(bodies, start=1):
        assert len(body) <= 64 * 1024, n
        response = client.post("/v1/embed", data=body, headers={**auth(key), **JSON})
        assert response.status_code == 400, (n, response.status_code, response.data[:200])
        assert (
            response.json["error"] in ("invalid_input", "bad_request") and response.json["message"]
        ), n
        assert remaining(response) == 50 - n, n  # counted once, by the app
        assert counted.calls == n, n
