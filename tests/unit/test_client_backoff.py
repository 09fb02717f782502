"""The client's retry policy: 408, 429, 502, 503 and 504 and a failed connection are sent
again after Retry-After (seconds or an HTTP date) or jittered exponential backoff, every
wait capped, within the caller's bound (retries and total time), then the error is raised.
The sync and async clients follow the same rules (httpx.MockTransport stands for the
network: these are the pure retry rules; the real app is in tests/integration)."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from laneway import AsyncClient, Backoff, Client, LanewayConnectionError, LanewayError, Retry
from laneway.client import _items, parse_retry_after
from laneway.retry import Attempts

from tests.bombs import planted_fifo, within


def test_retry_after_in_seconds_or_as_a_date():
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert parse_retry_after("7", now) == 7.0
    assert parse_retry_after(" 2.5 ", now) == 2.5
    later = format_datetime(now + timedelta(seconds=90), usegmt=True)
    assert parse_retry_after(later, now) == 90.0
    past = format_datetime(now - timedelta(seconds=90), usegmt=True)
    assert parse_retry_after(past, now) == 0.0
    assert parse_retry_after("-3", now) == 0.0
    for unreadable in (None, "", "soon", "Mon, 99 Foo"):
        assert parse_retry_after(unreadable, now) is None


def test_backoff_doubles_without_retry_after_and_never_passes_the_cap():
    policy = Backoff(retries=8, base=0.5, cap=5.0, jitter=False)
    assert [policy.delay(n, None) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert policy.delay(0, "3") == 3.0  # the server's word wins over the schedule
    assert policy.delay(4, "1") == 1.0
    assert policy.delay(0, "86400") == 5.0  # a hostile or mistaken header is capped
    assert policy.delay(0, "nonsense") == 0.5


def test_jitter_spreads_the_schedule_but_never_below_half_nor_the_servers_word():
    policy = Retry(base=1.0, cap=8.0, rng=random.Random(7))
    waits = [policy.delay(3, None) for _ in range(200)]
    assert all(4.0 <= w <= 8.0 for w in waits) and len({round(w, 3) for w in waits}) > 50
    assert {policy.delay(0, "2") for _ in range(20)} == {2.0}


def test_total_time_bounds_the_retries():
    now = [0.0]
    attempts = Attempts(Retry(retries=100, total=10.0, jitter=False, base=1.0), lambda: now[0])
    waits = []
    while (wait := attempts.next_delay(None)) is not None:
        waits.append(wait)
        now[0] += wait
    assert waits == [1.0, 2.0, 4.0]  # the next, 8 s, would end at 15 s: past the bound
    assert sum(waits) <= 10.0


def _client(answers, backoff=None):
    """A client whose server answers the given (status, headers) in turn; sleeps recorded."""
    seen, slept = [], []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status, headers = answers[min(len(seen) - 1, len(answers) - 1)]
        if status >= 400:
            body = {"error": "rate_limited", "message": "slow down"}
            return httpx.Response(status, headers=headers, json=body)
        return httpx.Response(status, json={"id": "j1", "status": "queued", "lane": "cpu"})

    client = Client(
        "http://laneway.test", "k", backoff=backoff or Retry(jitter=False),
        transport=httpx.MockTransport(handler), sleep=slept.append,
    )  # fmt: skip
    return client, seen, slept


def test_429_and_503_are_retried_after_their_retry_after():
    client, seen, slept = _client([(429, {"Retry-After": "2"}), (503, {}), (200, {})])
    assert client.job("j1").status == "queued"
    assert len(seen) == 3 and slept == [2.0, 1.0]  # Retry-After, then base x 2^1
    assert seen[0].headers["Authorization"] == "Bearer k"


@pytest.mark.parametrize("status", [408, 502, 504])
def test_gateway_and_timeout_answers_are_retried(status):
    client, seen, slept = _client([(status, {}), (200, {})])
    assert client.job("j1").id == "j1" and len(seen) == 2 and slept == [0.5]


def test_a_refused_connection_is_retried_then_named():
    calls = []

    def refuse(request):
        calls.append(request)
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    slept = []
    client = Client(
        "http://127.0.0.1:9", "k", retry=Retry(retries=3, jitter=False),
        transport=httpx.MockTransport(refuse), sleep=slept.append,
    )  # fmt: skip
    with pytest.raises(LanewayConnectionError) as err:
        client.job("j1")
    assert len(calls) == 4 and slept == [0.5, 1.0, 2.0]
    assert err.value.status == 0 and err.value.code == "connection_error"
    assert (
        str(err.value)
        == "cannot reach Laneway at http://127.0.0.1:9: [Errno 111] Connection refused"
    )
    assert isinstance(err.value, LanewayError)  # one except clause catches every failure


def test_the_async_client_retries_alike():
    answers = iter([(429, {"Retry-After": "1"}), (502, {}), (200, {})])
    seen, slept = [], []

    def handler(request):
        seen.append(request)
        status, headers = next(answers)
        if status >= 400:
            return httpx.Response(status, headers=headers, json={"error": "x", "message": "y"})
        return httpx.Response(200, json={"id": "j1", "status": "running", "lane": "gpu"})

    async def sleep(seconds):
        slept.append(seconds)

    async def main():
        async with AsyncClient(
            "http://laneway.test", "k", retry=Retry(jitter=False),
            transport=httpx.MockTransport(handler), sleep=sleep,
        ) as client:  # fmt: skip
            return await client.job("j1")

    job = asyncio.run(main())
    assert (job.status, job.lane) == ("running", "gpu") and slept == [1.0, 1.0]
    assert len(seen) == 3


def test_the_key_and_url_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("LANEWAY_URL", "http://env.test:1234/")
    monkeypatch.setenv("LANEWAY_API_KEY", "lw_env_key")
    client = Client()
    assert str(client.http.base_url) == "http://env.test:1234"
    assert client.http.headers["Authorization"] == "Bearer lw_env_key"
    assert Client("http://given.test", "given").http.headers["Authorization"] == "Bearer given"
    monkeypatch.delenv("LANEWAY_API_KEY")
    with pytest.raises(LanewayError, match="LANEWAY_API_KEY"):
        Client()


def test_retries_end_with_the_servers_error():
    client, seen, slept = _client([(429, {"Retry-After": "1"})], Retry(retries=3))
    with pytest.raises(LanewayError) as err:
        client.job("j1")
    assert (err.value.status, err.value.code, err.value.message) == (
        429,
        "rate_limited",
        "slow down",
    )
    assert len(seen) == 4 and slept == [1.0, 1.0, 1.0]


def test_other_errors_are_not_retried():
    for status in (400, 401, 404, 409, 500):
        client, seen, slept = _client([(status, {"Retry-After": "1"})])
        with pytest.raises(LanewayError):
            client.job("j1")
        assert len(seen) == 1 and slept == []


def test_an_upload_retried_sends_the_whole_file_again(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text("id,text\n1,hello\n2,world\n")
    client, seen, _ = _client([(503, {"Retry-After": "0"}), (200, {})])
    sent = []
    client.submit_file(path, progress=lambda n, total: sent.append((n, total)))
    # Each attempt carries the whole file (the multipart boundaries differ).
    bodies = [r.read().split(b"\r\n\r\n")[-1].split(b"\r\n")[0] for r in seen]
    assert len(bodies) == 2 and bodies[0] == bodies[1]
    assert bodies[1] == b"id,text\n1,hello\n2,world\n"
    assert sent[-1] == (path.stat().st_size, path.stat().st_size)


def test_items_from_texts_pairs_or_objects():
    assert _items(["a", ("x", "b"), {"id": "y", "text": "c"}]) == [
        {"id": "0", "text": "a"},
        {"id": "x", "text": "b"},
        {"id": "y", "text": "c"},
    ]


def test_an_upload_is_read_from_a_regular_file_only(tmp_path) -> None:
    """A device or a pipe (here a FIFO and a link to it, made in the test's folder) is
    refused before anything is sent: its reads would overrun the declared length."""
    fifo, link = planted_fifo(tmp_path)
    sent = []
    transport = httpx.MockTransport(lambda request: sent.append(request) or httpx.Response(500))
    client = Client("http://laneway.test", "lw_x", transport=transport)
    for path in (fifo, link, tmp_path):
        with within(30), pytest.raises(ValueError, match="not a regular file"):
            client.submit_file(path)
    with pytest.raises(FileNotFoundError):  # a path that is not there, as open() says it
        client.submit_file(tmp_path / "missing.csv")
    assert sent == []
