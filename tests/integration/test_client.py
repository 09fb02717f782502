"""laneway.Client against the real web app in this process (httpx's WSGI transport) on the
run's Postgres and Redis: jobs, results streamed, cancel, dead letters, the errors raised,
and a rate-limited submission retried until it goes through."""

from __future__ import annotations

import httpx
import pytest
from laneway import Backoff, Client, LanewayError

from tests.integration.conftest import store_results


@pytest.fixture
def connect(app):
    def make(key: str, app=app, **kwargs) -> Client:
        transport = httpx.WSGITransport(app=app)
        return Client("http://laneway.test", key, transport=transport, **kwargs)

    return make


def test_submit_results_cancel_and_retry(connect, account_factory):
    _, key = account_factory()
    client = connect(key)
    job = client.submit(["first", ("b", "second"), {"id": "c", "text": "third"}], tasks="embed")
    assert client.job(job["id"])["progress"]["total"] == 3
    output = {"embedding": [0.5], "tokens": 3}
    rows = [{"idx": n, "item_id": i, "output": output} for n, i in enumerate(("0", "b", "c"))]
    store_results(job["id"], rows)
    assert [r["id"] for r in client.results(job["id"])] == ["0", "b", "c"]
    assert next(iter(client.results(job["id"])))["tokens"] == 3
    assert client.cancel(job["id"])["status"] in ("cancelling", "cancelled")
    assert client.dead_letters(job["id"]) == {"dead_letters": []}
    with pytest.raises(LanewayError) as err:
        client.retry(job["id"])
    assert err.value.status == 409


def test_errors_are_raised_with_the_servers_code(connect, account_factory):
    (_, key), (_, other) = account_factory(), account_factory()
    job = connect(key).submit(["mine"])
    with pytest.raises(LanewayError) as err:
        connect(other).job(job["id"])  # another account's job does not exist for it
    assert (err.value.status, err.value.code) == (404, "not_found")
    with pytest.raises(LanewayError) as err:
        connect(key).submit([{"id": "1", "text": "a"}, {"id": "1", "text": "b"}])
    assert err.value.code == "invalid_input" and "duplicate id" in err.value.message
    with pytest.raises(LanewayError) as err:
        connect("lw_wrong").account()
    assert err.value.status == 401
    with pytest.raises(LanewayError) as err:
        connect(key).embeddings("hello", model="gpt-4")  # OpenAI's error shape, read alike
    assert (err.value.status, err.value.code) == (404, "model_not_found")


def test_a_rate_limited_client_waits_and_goes_through(make_app, settings, account_factory, connect):
    limits = dict(settings.account_limits)
    limits["demo"] = type(limits["demo"])("2/second", 10, 1 << 20)
    app = make_app(account_limits=limits)
    _, key = account_factory("demo")
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        __import__("time").sleep(seconds)

    client = connect(key, app=app, backoff=Backoff(retries=10, cap=2.0), sleep=sleep)
    jobs = [client.submit([f"text {n}"])["id"] for n in range(5)]
    assert len(set(jobs)) == 5  # every one stored once, none twice
    assert slept and all(0 < s <= 2.0 for s in slept)
