"""A batch worker steps aside while the interactive worker on its host is busy: the busy
mark in Redis, the wait before a micro-batch (bounded), and a chunk whose model stage
leaves the wait out of its time and cost."""

from __future__ import annotations

import dataclasses
import logging
import re
import time

import pytest
import redis
from sqlalchemy import select

from db.models import Chunk, Result
from db.session import session_scope
from laneway.yielding import BusyMark, StepAside, busy_key
from tests.factories import stored_job


@pytest.fixture
def r(settings):
    client = redis.Redis.from_url(settings.redis_url)
    yield client
    client.delete(*client.keys("laneway:interactive-busy:*") or ["-"])


def test_a_batch_waits_while_the_host_is_marked_busy_and_goes_on_when_the_mark_lapses(r):
    BusyMark(r, hold=0.3, host="h1").mark()
    assert 0 < r.pttl(busy_key("h1")) <= 300
    waited = StepAside(r, max_pause=5, host="h1")()
    # It waited for the mark's expiry, no longer than it had left.
    assert 0.15 <= waited < 1.0 and not r.exists(busy_key("h1"))


def test_the_wait_is_bounded_and_the_pauses_add_up(r):
    BusyMark(r, hold=30, host="h2").mark()
    aside = StepAside(r, max_pause=0.2, host="h2")
    first, second = aside(), aside()
    assert 0.2 <= first < 1.0 and 0.2 <= second < 1.0
    assert aside.paused == pytest.approx(first + second)
    assert r.exists(busy_key("h2"))  # still busy: the batch went on anyway


def test_another_hosts_traffic_is_no_reason_to_wait(r):
    BusyMark(r, hold=30, host="elsewhere").mark()
    aside = StepAside(r, max_pause=5, host="here")
    assert aside() == 0 and aside.paused == 0


def test_the_mark_is_written_at_most_every_quarter_hold(r):
    now = [100.0]
    mark = BusyMark(r, hold=0.4, host="h3", clock=lambda: now[0])
    mark.mark()
    assert r.exists(busy_key("h3"))
    r.delete(busy_key("h3"))
    now[0] += 0.05  # within a quarter of the hold: no write
    mark.mark()
    assert not r.exists(busy_key("h3"))
    now[0] += 0.06  # past it: written again
    mark.mark()
    assert r.exists(busy_key("h3"))


def test_a_chunk_leaves_its_wait_out_of_the_model_stage(settings, migrated, monkeypatch, caplog):
    import tasks.chunks

    stepping = dataclasses.replace(settings, batch_yield_max=5.0)
    monkeypatch.setattr(tasks.chunks, "get_settings", lambda: stepping)
    texts = ["my parcel is late", "I was charged twice", "cannot log in"]
    labels = ["shipping", "billing"]
    with caplog.at_level(logging.INFO, logger="tasks.chunks"):
        # No mark: no wait (and the models are loaded before the timed chunk).
        _, (quiet,) = stored_job(stepping, texts, labels=labels, prefix="q")
        tasks.chunks.run_chunk.apply(args=(quiet,)).get()
        assert not [m for m in caplog.messages if "stepped aside" in m]

        job_id, (chunk_id,) = stored_job(stepping, texts, labels=labels, prefix="y")
        client = redis.Redis.from_url(settings.redis_url)
        client.set(busy_key(), "1", px=1500)  # this host's interactive worker is busy
        started = time.perf_counter()
        tasks.chunks.run_chunk.apply(args=(chunk_id,)).get()
        wall = time.perf_counter() - started
    (line,) = [m for m in caplog.messages if "stepped aside" in m]
    paused = float(re.search(r"stepped aside ([\d.]+) s", line).group(1))
    assert paused >= 0.5  # it waited for the mark (most of its 1.5 s)
    with session_scope(settings) as session:
        chunk = session.get(Chunk, chunk_id)
        results = session.scalars(select(Result).where(Result.job_id == job_id)).all()
        assert chunk.state == "done" and len(results) == 3
        # The model stage's recorded time (its cost) leaves out the wait.
        assert chunk.model_seconds <= wall - paused
