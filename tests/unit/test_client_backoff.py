"""The client's retry policy: 429 and 503 are sent again after Retry-After (seconds or an
HTTP date) or exponential backoff, every wait capped, then the error is raised."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from laneway import Backoff, Client, LanewayError
from laneway.client import _items, parse_retry_after


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
    policy = Backoff(retries=8, base=0.5, cap=5.0)
    assert [policy.delay(n, None) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert policy.delay(0, "3") == 3.0  # the server's word wins over the schedule
    assert policy.delay(4, "1") == 1.0
    assert policy.delay(0, "86400") == 5.0  # a hostile or mistaken header is capped
    assert policy.delay(0, "nonsense") == 0.5


def _client(answers, backoff=None):
    """A client whose server answers the given (status, headers) in turn; sleeps recorded."""
    seen, slept = [], []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status, headers = answers[min(len(seen) - 1, len(answers) - 1)]
        if status >= 400:
            body = {"error": "rate_limited", "message": "slow down"}
            return httpx.Response(status, headers=headers, json=body)
        return httpx.Response(status, json={"id": "j1", "status": "queued"})

    client = Client(
        "http://laneway.test", "k", backoff=backoff, transport=httpx.MockTransport(handler),
        sleep=slept.append,
    )  # fmt: skip
    return client, seen, slept


def test_429_and_503_are_retried_after_their_retry_after():
    client, seen, slept = _client([(429, {"Retry-After": "2"}), (503, {}), (200, {})])
    assert client.job("j1")["status"] == "queued"
    assert len(seen) == 3 and slept == [2.0, 1.0]  # Retry-After, then base x 2^1
    assert seen[0].headers["Authorization"] == "Bearer k"


def test_retries_end_with_the_servers_error():
    client, seen, slept = _client([(429, {"Retry-After": "1"})], Backoff(retries=3))
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
