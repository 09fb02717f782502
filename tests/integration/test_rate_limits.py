"""Rate limits per account, counted in the real Redis and shared by every web process."""

from __future__ import annotations

import time

import pytest

from tests.integration.conftest import auth


@pytest.fixture
def two_apps(make_app, settings):
    """Two separately created apps, as two gunicorn workers would be, with low limits."""
    limits = dict(settings.account_limits)
    limits["trial"] = type(limits["trial"])("5/minute", 10, 1 << 20)
    return [make_app(account_limits=limits) for _ in range(2)]


def test_the_count_is_shared_by_two_apps_and_ends_in_a_429(two_apps, account_factory):
    _, key = account_factory("trial")
    a, b = (app.test_client() for app in two_apps)
    answers = [(a if n % 2 else b).get("/v1/account", headers=auth(key)) for n in range(5)]
    assert [r.status_code for r in answers] == [200] * 5
    assert [r.headers["RateLimit-Remaining"] for r in answers] == ["4", "3", "2", "1", "0"]
    first = answers[0].headers
    assert first["RateLimit-Limit"] == first["X-RateLimit-Limit"] == "5"
    assert first["RateLimit-Policy"] == "5;w=60"
    assert 0 <= int(first["RateLimit-Reset"]) <= 60
    assert int(first["X-RateLimit-Reset"]) >= int(time.time())  # a Unix time
    assert "Retry-After" not in first

    refused = a.get("/v1/account", headers=auth(key))
    assert refused.status_code == 429
    assert refused.json["error"] == "too_many_requests"
    assert "trial accounts may make 5/minute (LANEWAY_RATE_LIMIT_TRIAL)" in refused.json["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.headers["RateLimit-Remaining"] == "0"
    # Every endpoint draws on the same budget, the other app included.
    assert b.post("/v1/jobs", json={}, headers=auth(key)).status_code == 429

    # Another account of the same type has its own budget.
    _, other = account_factory("trial")
    assert b.get("/v1/account", headers=auth(other)).status_code == 200


def test_requests_without_a_valid_key_are_limited_per_address(make_app):
    client = make_app(anonymous_rate_limit="3/minute").test_client()
    env = {"REMOTE_ADDR": "192.0.2.77"}  # an address no other test uses
    bad = {"Authorization": "Bearer lw_0123456789ab_guess"}
    codes = [client.get("/v1/account", headers=bad, environ_base=env).status_code for _ in range(3)]
    assert codes == [401] * 3
    refused = client.get("/v1/account", headers=bad, environ_base=env)
    assert refused.status_code == 429 and "LANEWAY_RATE_LIMIT_ANONYMOUS" in refused.json["message"]
    assert int(refused.headers["Retry-After"]) >= 1
    # Probes, health checks, scrapes and KEDA's reads of the lanes are never limited.
    for path in ("/livez", "/healthz", "/lanes", "/metrics"):
        answer = client.get(path, environ_base=env)
        assert answer.status_code == 200, (path, answer.status_code)


def test_redis_down_lets_requests_through_rather_than_failing_them(make_app, account_factory):
    # Nothing listens on port 1: the limiter cannot count, and must not turn that into a 500.
    client = make_app(redis_url="redis://127.0.0.1:1/0").test_client()
    _, key = account_factory()
    response = client.get("/v1/account", headers=auth(key))
    assert response.status_code == 200 and "RateLimit-Limit" not in response.headers


def test_the_cli_client_waits_out_a_429_while_polling(make_app, settings, account_factory):
    import httpx
    from laneway.client import Client

    limits = dict(settings.account_limits)
    limits["demo"] = type(limits["demo"])("2/second", 10, 1 << 20)
    app = make_app(account_limits=limits)
    _, key = account_factory("demo")
    client = Client("http://laneway.test", key)
    refused = []
    client.http = httpx.Client(
        transport=httpx.WSGITransport(app=app),
        base_url="http://laneway.test",
        headers=client.http.headers,
        event_hooks={"response": [lambda r: refused.append(r) if r.status_code == 429 else None]},
    )
    job_id = client.http.post("/v1/jobs", json={"items": [{"id": "1", "text": "hi"}]}).json()["id"]
    polls = [client.job(job_id)["status"] for _ in range(4)]
    assert polls == ["queued"] * 4
    assert refused and all(int(r.headers["Retry-After"]) >= 1 for r in refused)


def test_each_limited_request_costs_redis_one_script(two_apps, settings, account_factory):
    """The hit and the window its headers show come back from one script run: one round
    trip to Redis for the limiter per request (issue 19), the count still shared."""
    import redis

    _, key = account_factory("trial")
    client = two_apps[0].test_client()
    client.get("/v1/account", headers=auth(key))  # scripts loaded, key cache warm
    r = redis.Redis.from_url(settings.redis_url)
    db = r.connection_pool.connection_kwargs.get("db", 0)
    marker = f"limiter-done-{time.time_ns()}"
    with r.monitor() as monitor:
        answer = client.get("/v1/account", headers=auth(key))
        r.echo(marker)
        commands = []
        while marker not in (seen := monitor.next_command())["command"]:
            if seen["db"] == db:
                commands.append(seen["command"].split()[0].upper())
    assert answer.status_code == 200 and answer.headers["RateLimit-Remaining"] == "3"
    scripts = [c for c in commands if c in ("EVALSHA", "EVAL")]
    assert len(scripts) == 1, commands


def test_a_window_read_with_a_hit_answers_only_its_own_key_while_fresh(settings):
    from limits import RateLimitItemPerMinute
    from limits.storage import storage_from_string
    from limits.strategies import SlidingWindowCounterRateLimiter

    from webapp.ratelimit_storage import OneTripRedisStorage
    from webapp.security import limiter_storage_url

    storage = storage_from_string(limiter_storage_url(settings.redis_url))
    assert isinstance(storage, OneTripRedisStorage)
    limiter = SlidingWindowCounterRateLimiter(storage)
    item = RateLimitItemPerMinute(3)
    tag = f"fresh-{time.time_ns()}"
    assert limiter.hit(item, tag, "a") and limiter.hit(item, tag, "a")
    # Another key's window is read from Redis, not taken from a's hit.
    assert limiter.get_window_stats(item, tag, "b").remaining == 3
    limiter.hit(item, tag, "a")
    assert limiter.get_window_stats(item, tag, "a").remaining == 0  # from the hit
    assert limiter.get_window_stats(item, tag, "a").remaining == 0  # read again: the same
    assert not limiter.hit(item, tag, "a")  # the fourth is refused, in Redis
    assert limiter.get_window_stats(item, tag, "a").remaining == 0
