"""Where a batch's answers leave the interactive worker, on the run's real Redis: from the
model thread that ran the batch, so a caller's answer never waits for the sender thread,
which then stores the batch's cache entries and records its figures. The model is left
out (a batch's outputs are made up): what is tested is the worker's hand-off, not the
forward."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from core.store import interactive_protocol as ia
from core.store import usage
from inference.dynamic import DynamicBatcher
from inference.stages import StageTimes
from workers import interactive_server
from workers.interactive_server import BatchFigures, Incoming, InteractiveServer


@pytest.fixture
def server(settings, monkeypatch):
    made = InteractiveServer(settings)
    # A lane of its own: the usage counters read below are this test's alone.
    made._lane_device = (f"interactive.test-{uuid.uuid4().hex[:8]}", "cpu")

    def run_batch(requests, later):  # noqa: ARG001 - the signature of _run_batch
        model = made.model_seconds  # the batch's model stage, as the test sets it
        answers = [[{"id": i, "embedding": [0.25, 0.5]} for i in r.ids] for r in requests]
        items = sum(len(r.texts) for r in requests)
        timing = {"started": time.time(), "run": 1.0, "model": 1.0,
                  "batch_requests": len(requests), "batch_items": items}  # fmt: skip
        return answers, timing, BatchFigures(items, 0, StageTimes(model=model))

    made.model_seconds = 0.001
    monkeypatch.setattr(made, "_run_batch", run_batch)
    yield made
    if made._sender is not None:
        made._sender.shutdown(wait=True)


def _incoming(n_items: int) -> Incoming:
    items = [(f"i{n}", f"text {n} {uuid.uuid4().hex}") for n in range(n_items)]
    request = ia.new_request(["embed"], [], items, keep=False, account=1)
    return Incoming(request, time.time())


def _usage_items(r: redis.Redis, lane: str) -> int:
    minutes = usage.last_hour(r, [lane], time.time())[lane]
    return sum(minute.items for _, minute in minutes)


def test_the_answers_leave_while_the_sender_is_busy(server, settings):
    r = redis.Redis.from_url(settings.redis_url)
    lane = server.lane_and_device()[0]
    held = threading.Event()
    server._sender = ThreadPoolExecutor(1)
    server._sender.submit(held.wait, 30)  # the sender busy with an earlier batch
    batch = [_incoming(2), _incoming(1)]
    try:
        bodies = server.run_requests(batch)
        for incoming, body in zip(batch, bodies, strict=True):
            got = r.blpop([ia.reply_key(incoming.request.id)], timeout=5)
            assert got is not None, "the answer waited for the sender"
            delivered = ia.loads(got[1])
            assert delivered["status"] == ia.SUCCESS
            assert [o["id"] for o in delivered["output"]] == incoming.request.ids
            assert delivered["output"] == body["output"]
        # What nobody waits on is still the sender's: not counted while it is busy.
        assert _usage_items(r, lane) == 0
    finally:
        held.set()
    server._sender.shutdown(wait=True)
    assert _usage_items(r, lane) == 3


def test_a_delivery_that_fails_leaves_the_model_thread_going(server, settings, monkeypatch):
    """Not only Redis errors: whatever the delivery raises, the batch's caller sees it end
    (its wait lapses and the web app stores the request as a job), and the batch is still
    counted."""
    r = redis.Redis.from_url(settings.redis_url)
    lane = server.lane_and_device()[0]
    server._sender = ThreadPoolExecutor(1)

    def broken(*_args, **_kwargs):
        raise ValueError("an answer that does not encode")

    monkeypatch.setattr(interactive_server, "deliver", broken)
    incoming = _incoming(2)
    bodies = server.run_requests([incoming])
    assert bodies[0]["status"] == ia.SUCCESS
    server._sender.shutdown(wait=True)
    assert r.llen(ia.reply_key(incoming.request.id)) == 0
    assert _usage_items(r, lane) == 2


def test_each_batch_tells_the_batcher_how_much_of_it_was_the_model(server, settings):
    """The batcher runs batches side by side only while the model is most of a batch's
    time (inference/dynamic.py SideBySide): the server reports each batch's model stage
    and its whole time on the model thread, answers included."""
    r = redis.Redis.from_url(settings.redis_url)
    server._batcher = DynamicBatcher(server.run_requests, threads=2)  # not started
    side = server._batcher.side_by_side
    server.model_seconds = 0.0  # a model that costs nothing: the batch is all the rest
    for _ in range(20):
        incoming = _incoming(1)
        server.run_requests([incoming])
        assert r.blpop([ia.reply_key(incoming.request.id)], timeout=5) is not None
    assert side.model == 0.0 and side.whole > 0.0 and side.allowed == 1
    server.model_seconds = 60.0  # a model that is the whole batch's time
    for _ in range(20):
        server.run_requests([_incoming(1)])
    assert side.model > 0.5 * side.whole and side.allowed == 2
