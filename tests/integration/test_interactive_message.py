"""The interactive path's request lists on the real Redis: what a request's entry holds,
how a worker takes entries (BLMPOP, or BLPOP and LPOP on an older Redis), what it does with
entries that are not requests, and a worker that stops putting back what it took and had
not started. The worker's own answers are in test_interactive.py."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
import redis

from core.store import interactive_protocol as ia
from webapp import interactive_client as ic
from workers.interactive_server import InteractiveServer


@pytest.fixture
def r(settings):
    return redis.Redis.from_url(settings.redis_url)


def lane() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def request(n: int, text: str = "a text") -> ia.Request:
    return ia.new_request(["embed"], [], [(str(n), f"{text} {n}")], keep=False, account=1)


def test_the_entry_is_the_request_and_lapses_with_its_list(r):
    secret = "my card number is 4111 1111 1111 1111"
    req = ia.new_request(["classify"], ["billing"], [("a", secret)], keep=False, account=7)
    where = lane()
    with r.pipeline(transaction=False) as pipe:
        ia.push(pipe, where, [req])
        pipe.execute()
    (raw,) = r.lrange(ia.requests_key(where), 0, -1)
    entry = json.loads(raw)
    assert entry["texts"] == [secret] and entry["account"] == 7 and entry["labels"] == ["billing"]
    # No deadline (the asynchronous pair's), no trace: neither is written.
    assert "deadline" not in entry and "trace" not in entry
    assert 0 < r.ttl(ia.requests_key(where)) <= ia.REQUESTS_TTL
    assert ia.parse(raw) == req


def test_a_synchronous_request_carries_its_deadline_and_nobody_waits_past_it(r):
    where = lane()
    req = request(1)
    started = time.time()
    assert ia.send_and_wait(r, req, where, 0.2) is None  # no worker: no answer in time
    (raw,) = r.lrange(ia.requests_key(where), 0, -1)
    taken = ia.parse(raw)
    assert taken is not None and started + 0.2 <= taken.deadline <= time.time()
    assert taken.stale(time.time()) and not taken.stale(started)
    # Nothing is queued at all when the caller will not wait.
    assert ia.send_and_wait(r, request(2), where, 0) is None
    assert r.llen(ia.requests_key(where)) == 1


@pytest.mark.parametrize("blmpop", [True, False], ids=["blmpop", "blpop-lpop"])
def test_a_worker_takes_up_to_a_batch_in_order_and_puts_back_in_order(r, blmpop):
    where = lane()
    popper = ia.Popper(r, where)
    popper.blmpop = blmpop
    entries = [request(n).encode() for n in range(5)]
    r.rpush(ia.requests_key(where), *entries)
    assert popper.pop(3, 1.0) == entries[:3]
    popper.put_back(entries[1:3])  # taken and not started: back at the head, in order
    assert popper.pop(10, 1.0) == entries[1:]
    started = time.monotonic()
    assert popper.pop(10, 0.2) == []  # empty: it waits, then says so
    assert time.monotonic() - started >= 0.15


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1, 2]",
        b'{"id": "x"}',
        b'{"bogus": 1}',
        b'{"id": "x", "tasks": ["embed"], "labels": [], "ids": ["1"], "texts": 5}',
        b'{"id": "x", "tasks": ["embed"], "labels": [], "ids": ["1", "2"], "texts": ["a"]}',
        b'{"id": 3, "tasks": ["embed"], "labels": [], "ids": ["1"], "texts": ["a"]}',
        b'{"id": "x", "tasks": [{}], "labels": [], "ids": ["1"], "texts": ["a"]}',
        b'{"id": "x", "tasks": ["embed"], "labels": [], "ids": ["1"], "texts": ["a"], '
        b'"deadline": "soon"}',
    ],
)
def test_an_entry_that_is_not_a_request_is_dropped(raw):
    assert ia.parse(raw) is None


def test_with_redis_away_the_caller_is_told_no_answer(settings):
    away = settings.replace(redis_url="redis://127.0.0.1:1/0")
    assert ic.send_and_wait(away, request(1), "cpu", 0.5) is None


class HeldServer(InteractiveServer):
    """A server whose batches (of one request each) wait until released: no model."""

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self.running, self.release = threading.Event(), threading.Event()

    def _run_batch(self, requests, later):
        self.running.set()
        assert self.release.wait(30)
        results = [
            [{"id": i, "echo": t} for i, t in zip(r.ids, r.texts, strict=True)] for r in requests
        ]
        timing = {"started": time.time(), "run": 0.0, "batch_requests": len(requests)}
        return results, timing, None


def test_a_stopping_worker_puts_back_what_it_took_and_had_not_started(settings, r):
    from tests.e2e.procs import wait_for

    where = lane()
    server = HeldServer(settings.replace(batch_max=1))
    requests = [request(n) for n in range(3)]
    server.feed(where)
    try:
        with r.pipeline(transaction=False) as pipe:
            ia.push(pipe, where, requests)
            pipe.execute()
        assert server.running.wait(30)  # the first request's batch runs, the rest wait
        key = ia.requests_key(where)
        wait_for(lambda: r.llen(key) == 0, 30, "the feeder takes every request", [])
        stopping = threading.Thread(target=server.stop)
        stopping.start()
        wait_for(lambda: r.llen(key) == 2, 30, "the two not started are put back", [])
        server.release.set()
        stopping.join(30)
        assert not stopping.is_alive()
    finally:
        server.release.set()
        server.stop()
    # The first was answered; the other two are back at the head, in their order, for the
    # next worker, and nobody answered them.
    first = ia.wait_answer(r, requests[0].id, 5)
    assert first is not None and first["status"] == ia.SUCCESS
    assert first["output"] == [{"id": "0", "echo": "a text 0"}]
    assert [ia.parse(raw).id for raw in r.lrange(key, 0, -1)] == [q.id for q in requests[1:]]
    assert not r.exists(ia.reply_key(requests[1].id), ia.reply_key(requests[2].id))


def test_a_request_being_handed_over_when_the_worker_stops_is_put_back_too(settings, r):
    """The feeder has taken the last request off the list and not yet handed it to the
    batcher when the stop begins: it is put back with the other one not started, in
    order, and no batch starts for it (a fresh batcher used to, and nobody stopped it)."""
    from tests.e2e.procs import wait_for

    where = lane()
    server = HeldServer(settings.replace(batch_max=1))
    handing, go_on = threading.Event(), threading.Event()
    takes: list[int] = []
    mark = server.busy.mark

    def held_mark() -> None:  # the feeder's hand-over of its third request waits here
        takes.append(1)
        if len(takes) == 3:
            handing.set()
            go_on.wait(30)
        mark()

    server.busy.mark = held_mark
    requests = [request(n) for n in range(3)]
    server.feed(where)
    feeder = server._feeder
    stopping = threading.Thread(target=server.stop)
    try:
        with r.pipeline(transaction=False) as pipe:
            ia.push(pipe, where, requests)
            pipe.execute()
        assert server.running.wait(30) and handing.wait(30)
        key = ia.requests_key(where)
        assert r.llen(key) == 0  # every request is off the list
        stopping.start()
        wait_for(feeder.stopping.is_set, 30, "the stop begins", [])
        go_on.set()  # the hand-over goes on while the stop waits for the feeder
        wait_for(lambda: r.llen(key) == 2, 30, "the two not started are put back", [])
        server.release.set()
        stopping.join(30)
        assert not stopping.is_alive()
    finally:
        go_on.set()
        server.release.set()
        server.stop()
    assert [ia.parse(raw).id for raw in r.lrange(key, 0, -1)] == [q.id for q in requests[1:]]
    first = ia.wait_answer(r, requests[0].id, 5)
    assert first is not None and first["status"] == ia.SUCCESS
    assert not r.exists(ia.reply_key(requests[1].id), ia.reply_key(requests[2].id))


def test_a_stopped_worker_takes_nothing_more(settings, r):
    """After its stop no batcher starts again: a request from the list is refused (for
    its feeder to put back), and one sent as a Celery message is answered with an error."""
    from workers.interactive_server import STOPPED_BEFORE, Stopping

    server = HeldServer(settings)
    server.batcher()
    server.stop()
    with pytest.raises(Stopping):
        server.take([request(1)], listed=True)
    assert server._batcher is None and not server.running.is_set()
    late = request(2)
    server.serve([late.message()])
    told = ia.wait_answer(r, late.id, 5)
    assert told is not None and told["status"] != ia.SUCCESS
    assert STOPPED_BEFORE in json.dumps(told)
    assert not server.running.is_set()
