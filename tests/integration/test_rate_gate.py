"""The rate limit counted in the round trip that queues a synchronous interactive request
(webapp/ratelimit_gate.py), through a real interactive worker on the run's Redis: the same
budget as every other endpoint, each request counted once whatever it is answered, and a
refused request never queued nor turned into a job."""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from flask import g
from sqlalchemy import func, select

from core.store.interactive_protocol import requests_key
from db.models import Job
from db.session import session_scope
from tests.e2e.procs import interactive_worker
from tests.integration.conftest import auth
from tests.integration.test_interactive import wait_stored
from tests.integration.test_json_budget import _costly

pytestmark = pytest.mark.e2e
COSTLY = _costly("items")  # a body the web app refuses (413) before parsing it
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def worker(tmp_path_factory, settings, migrated):
    logdir = tmp_path_factory.mktemp("rategate")
    with interactive_worker(settings, logdir, "rategate-it", {"LANEWAY_CACHE_TTL": "300"}) as proc:
        yield proc


def limited(make_app, settings, rate: str, **changes):
    """An app whose trial accounts may make `rate` (one limit item: gated)."""
    limits = dict(settings.account_limits)
    limits["trial"] = type(limits["trial"])(rate, 10, 16 << 20)
    return make_app(**{"account_limits": limits, "sync_timeout": 30.0, "cache_ttl": 300, **changes})


def embed(client, key, *texts, headers=None, **extra):
    items = [{"id": str(n), "text": t} for n, t in enumerate(texts)]
    return client.post(
        "/v1/embed", json={"items": items, **extra}, headers={**auth(key), **(headers or {})}
    )


def remaining(response) -> int:
    return int(response.headers["RateLimit-Remaining"])


def jobs_of(account_id: int) -> int:
    with session_scope() as s:
        return s.scalar(select(func.count()).select_from(Job).where(Job.account_id == account_id))


def test_gated_and_other_requests_share_one_budget_on_every_app(
    worker, make_app, settings, account_factory
):
    a, b = (limited(make_app, settings, "5/minute").test_client() for _ in range(2))
    account, key = account_factory("trial")
    t = uuid.uuid4().hex[:8]
    answers = [
        embed(a, key, f"first {t}"),
        b.get("/v1/account", headers=auth(key)),
        embed(b, key, f"second {t}"),
        a.get("/v1/account", headers=auth(key)),
        a.post(
            "/v1/embeddings", json={"input": f"third {t}", "model": "minilm"}, headers=auth(key)
        ),
    ]
    assert [r.status_code for r in answers] == [200] * 5, [r.json for r in answers]
    assert [remaining(r) for r in answers] == [4, 3, 2, 1, 0]
    first = answers[0].headers
    assert first["RateLimit-Limit"] == first["X-RateLimit-Limit"] == "5"
    assert first["RateLimit-Policy"] == "5;w=60" and "Retry-After" not in first
    assert int(first["X-RateLimit-Reset"]) >= int(time.time())

    # Over the limit, a request to the gpu lane (no worker serves it here) is refused at
    # once: nothing is queued and no job is made of it.
    gpu = limited(make_app, settings, "5/minute", interactive_lane="gpu").test_client()
    r = redis.Redis.from_url(settings.redis_url)
    queued = r.llen(requests_key("gpu"))
    began = time.monotonic()
    refused = embed(gpu, key, f"refused {t}", headers={"Prefer": "wait=20"})
    assert refused.status_code == 429, refused.json
    # The script answered the wait itself: it did not run out its 20 seconds.
    assert time.monotonic() - began < 10
    assert refused.json["error"] == "too_many_requests"
    assert "trial accounts may make 5/minute (LANEWAY_RATE_LIMIT_TRIAL)" in refused.json["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert remaining(refused) == 0 and refused.headers["X-RateLimit-Remaining"] == "0"
    assert r.llen(requests_key("gpu")) == queued
    assert jobs_of(account.id) == 0
    # The OpenAI route answers its own shape; every other endpoint is refused too.
    openai = a.post("/v1/embeddings", json={"input": "x", "model": "minilm"}, headers=auth(key))
    assert openai.status_code == 429 and openai.json["error"]["type"] == "rate_limit_error"
    assert b.post("/v1/jobs", json={}, headers=auth(key)).status_code == 429
    # Another account of the same type has its own budget.
    _, other = account_factory("trial")
    assert embed(a, other, f"other {t}").status_code == 200


def test_each_request_is_counted_once_whatever_answers_it(
    worker, make_app, settings, account_factory
):
    client = limited(make_app, settings, "50/minute").test_client()
    gpu = limited(make_app, settings, "50/minute", interactive_lane="gpu").test_client()
    account, key = account_factory("trial")
    t = uuid.uuid4().hex[:8]
    seen = []

    answered = embed(client, key, f"cached {t}")
    assert answered.status_code == 200 and answered.json["cached"] is False
    seen.append(remaining(answered))
    wait_stored(settings, account.id, [f"cached {t}"])
    cached = embed(client, key, f"cached {t}")
    assert cached.status_code == 200 and cached.json["cached"] is True
    seen.append(remaining(cached))
    bad = client.post("/v1/embed", json={"items": "nope"}, headers=auth(key))
    assert bad.status_code == 400
    seen.append(remaining(bad))
    not_json = client.post("/v1/embed", data="items", headers=auth(key))
    assert not_json.status_code == 415
    seen.append(remaining(not_json))
    costly = client.post("/v1/embed", data=COSTLY, headers={**auth(key), **JSON})
    assert costly.status_code == 413
    seen.append(remaining(costly))
    at_once = embed(client, key, f"at once {t}", headers={"Prefer": "wait=0"})
    assert at_once.status_code == 202
    seen.append(remaining(at_once))
    # Queued through the gate, nobody answers in time: a job, counted by the gate alone.
    missed = embed(gpu, key, f"missed {t}", headers={"Prefer": "wait=1"})
    assert missed.status_code == 202, missed.json
    seen.append(remaining(missed))
    assert seen == list(range(49, 49 - len(seen), -1))
    assert jobs_of(account.id) == 2


def test_over_the_limit_no_answer_has_a_side_effect(worker, make_app, settings, account_factory):
    client = limited(make_app, settings, "1/minute").test_client()
    account, key = account_factory("trial")
    assert embed(client, key, f"only {uuid.uuid4().hex}").status_code == 200
    for response in (
        embed(client, key, "later", headers={"Prefer": "wait=0"}),  # would be a job
        client.post("/v1/embed", json={"items": "nope"}, headers=auth(key)),  # would be 400
        client.post("/v1/embed", data=COSTLY, headers={**auth(key), **JSON}),  # would be 413
    ):
        assert response.status_code == 429, response.json
        assert int(response.headers["Retry-After"]) >= 1
    assert jobs_of(account.id) == 0


def test_a_gated_request_costs_redis_one_script_beside_its_wait(
    worker, make_app, settings, account_factory
):
    client = limited(make_app, settings, "100/minute").test_client()
    _, key = account_factory("trial")
    embed(client, key, f"warm {uuid.uuid4().hex}")
    r = redis.Redis.from_url(settings.redis_url)
    db = r.connection_pool.connection_kwargs.get("db", 0)
    marker = f"gate-done-{time.time_ns()}"
    with r.monitor() as monitor:
        answer = embed(client, key, f"watched {uuid.uuid4().hex}")
        r.echo(marker)
        commands = []
        while marker not in (seen := monitor.next_command())["command"]:
            if seen["db"] == db:
                commands.append(seen["command"].split()[0].upper())
    assert answer.status_code == 200 and remaining(answer) == 98
    # MONITOR lists a script's own commands after it: the count's, then the queueing's.
    assert commands.count("EVAL") == 1 and "EVALSHA" not in commands, commands
    assert commands.index("EVAL") < commands.index("RPUSH") < commands.index("BLPOP"), commands


def test_a_limit_of_two_items_and_callers_without_a_key_go_through_the_limiter(
    worker, make_app, settings, account_factory
):
    client = limited(make_app, settings, "2/minute;100/hour").test_client()
    _, key = account_factory("trial")
    codes = [embed(client, key, f"two {uuid.uuid4().hex}").status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    anonymous = make_app(anonymous_rate_limit="2/minute").test_client()
    env = {"REMOTE_ADDR": "192.0.2.91"}  # an address no other test uses
    bad = {"Authorization": "Bearer lw_0123456789ab_guess"}
    codes = [
        anonymous.post("/v1/embed", json={}, headers=bad, environ_base=env).status_code
        for _ in range(3)
    ]
    assert codes == [401, 401, 429]


def test_each_account_type_s_gate_carries_its_own_limit_outside_any_request(
    make_app, settings, account_factory
):
    """The fast path makes gates beneath Flask: each account gets its own type's limit, the
    first of each type too, and the same key and limit as a request's own gate."""
    limits = dict(settings.account_limits)
    limits["trial"] = type(limits["trial"])("7/minute", 10, 16 << 20)
    limits["standard"] = type(limits["standard"])("11/minute", 10, 16 << 20)
    limits["enterprise"] = type(limits["enterprise"])("5/minute;100/hour", 10, 16 << 20)
    app = make_app(account_limits=limits)
    gates = app.extensions["laneway_gates"]
    (trial, _), (standard, _) = account_factory("trial"), account_factory("standard")
    enterprise, _ = account_factory("enterprise")
    for account, amount in ((trial, 7), (standard, 11), (trial, 7), (standard, 11)):
        gate = gates.for_account(account)
        assert gate.limit.limit.amount == amount and str(account.id) in gate.key
    assert gates.for_account(enterprise) is None  # two limit items: Flask-Limiter's
    with app.test_request_context("/v1/embed", method="POST"):
        g.account = trial
        inside = gates.for_account(trial)
    outside = gates.for_account(trial)
    assert (inside.key, inside.limit.limit) == (outside.key, outside.limit.limit)


def test_redis_away_turns_a_gated_request_into_a_job_not_a_500(make_app, account_factory):
    client = make_app(redis_url="redis://127.0.0.1:1/0", sync_timeout=2.0).test_client()
    account, key = account_factory("trial")
    response = embed(client, key, "no redis")
    assert response.status_code == 202, response.json
    assert jobs_of(account.id) == 1


def test_a_burst_at_the_limit_lets_exactly_the_limit_through(
    worker, make_app, settings, account_factory
):
    """Sixteen callers at once, gated and not, two web apps, a budget of ten: ten answered,
    six refused, whichever way each was counted."""
    from concurrent.futures import ThreadPoolExecutor

    apps = [limited(make_app, settings, "10/minute") for _ in range(2)]
    _, key = account_factory("trial")
    t = uuid.uuid4().hex[:8]

    def call(n: int) -> int:
        client = apps[n % 2].test_client()
        if n % 3:
            return embed(client, key, f"burst {n} {t}").status_code
        return client.get("/v1/account", headers=auth(key)).status_code

    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(call, range(16)))
    assert sorted(codes) == [200] * 10 + [429] * 6, codes
