"""A batch worker steps aside while the interactive worker on its host is busy: the busy
mark in Redis, the wait before a micro-batch (bounded), and a chunk whose model stage
leaves the wait out of its time and cost."""

from __future__ import annotations

import logging
import re
import time

import pytest
import redis
from sqlalchemy import select

from db.models import Chunk, Result
from db.session import session_scope
from tests.factories import stored_job
from workers.cores import BusyMark, StepAside, busy_key, mark_left_ms


@pytest.fixture
def r(settings):
    client = redis.Redis.from_url(settings.redis_url)
    yield client
    client.delete(*client.keys("laneway:interactive-busy:*") or ["-"])


def test_a_batch_waits_while_the_host_is_marked_busy_and_goes_on_when_the_mark_lapses(r):
    BusyMark(r, hold=0.3, host="h1").mark()
    assert 0 < r.pttl(busy_key("h1")) <= 300
    waited = StepAside(r, max_pause=5, host="h1")()
    # It waited for the mark's expiry, no longer than it had left. (Redis answers PTTL 0
    # for a key with under a millisecond left, which EXISTS may still see: lapsed for us.)
    assert 0.15 <= waited < 1.0 and mark_left_ms(r, busy_key("h1")) == 0


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


def test_a_chunk_leaves_its_wait_out_of_the_model_stage(
    settings, migrated, monkeypatch, caplog, worker_app
):
    import tasks.chunks

    stepping = settings.replace(batch_yield_max=5.0)
    worker_app(stepping)
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


@pytest.fixture
def sharing(settings, migrated, monkeypatch, worker_app):
    """Settings of a 2-core host whose batch worker never waits (only its threads change),
    with this process's torch threads put back afterwards."""
    import torch

    before = torch.get_num_threads()
    shared = settings.replace(torch_threads=2, batch_yield_max=0.0)
    worker_app(shared)
    torch.set_num_threads(2)
    yield shared
    torch.set_num_threads(before)


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_the_batch_side_gives_a_core_back_while_the_mark_stands_and_takes_it_again(
    sharing, r, monkeypatch
):
    import torch

    import tasks.chunks
    from tasks.chunks import CancelWatch

    monkeypatch.setattr(tasks.chunks, "LOOK_EVERY", 0.0)  # every call looks

    job_id, _ = stored_job(sharing, ["one text"], prefix="w")
    watch = CancelWatch(job_id, share=True)
    assert watch() is False and torch.get_num_threads() == 2  # idle host: every core
    BusyMark(r, hold=0.5).mark()  # this host's interactive worker took a request
    assert watch() is False and torch.get_num_threads() == 1
    wait_until(lambda: not r.exists(busy_key()), 5, "the mark to lapse")
    assert watch() is False and torch.get_num_threads() == 2
    assert watch.cores.changes == 2


def test_each_of_several_batch_workers_on_a_host_waits_their_count_times_as_long(
    sharing, worker_app
):
    """Two one-thread workers on this host's cores (as `laneway fleet` runs them by default
    on two cores) each wait twice LANEWAY_BATCH_YIELD_MAX: the host's batch side as a whole
    takes the same share of the cores from a steady interactive stream as one worker."""
    import tasks.chunks
    from core.config.host import usable_cores

    cores = usable_cores()
    for threads, count in ((cores, 1), (1, cores)):
        worker_app(sharing.replace(torch_threads=threads, batch_yield_max=0.5))
        job_id, _ = stored_job(sharing, ["one text"], prefix=f"n{threads}")
        watch = tasks.chunks.CancelWatch(job_id, share=True, step_aside=True)
        assert watch.step_aside.max_pause == pytest.approx(0.5 * count)


def test_a_cancelled_job_stops_at_once_even_while_the_host_is_busy(
    sharing, r, monkeypatch, worker_app
):
    import tasks.chunks
    from jobs.lifecycle import cancel_key

    stepping = sharing.replace(batch_yield_max=30.0)
    worker_app(stepping)
    job_id, _ = stored_job(stepping, ["one text"], prefix="c")
    BusyMark(r, hold=30).mark()
    r.set(cancel_key(job_id), "1", ex=60)
    started = time.monotonic()
    assert tasks.chunks.CancelWatch(job_id, share=True, step_aside=True)() is True
    assert time.monotonic() - started < 5  # it did not wait out the 30 s mark first


def test_a_chunk_runs_a_core_fewer_under_interactive_work_and_every_core_after(sharing, r, caplog):
    import torch

    import tasks.chunks

    texts = [f"text number {i} about a parcel" for i in range(6)]
    with caplog.at_level(logging.INFO, logger="tasks.chunks"):
        _, (busy_chunk,) = stored_job(sharing, texts, prefix="b")
        r.set(busy_key(), "1", px=60_000)  # busy through the whole chunk
        tasks.chunks.run_chunk.apply(args=(busy_chunk,)).get()
        assert torch.get_num_threads() == 1
        r.delete(busy_key())  # the traffic stopped
        _, (idle_chunk,) = stored_job(sharing, texts, prefix="i")
        tasks.chunks.run_chunk.apply(args=(idle_chunk,)).get()
        assert torch.get_num_threads() == 2
    lines = [m for m in caplog.messages if "changed its torch threads" in m]
    assert [m.split()[1] for m in lines] == [str(busy_chunk), str(idle_chunk)]
    assert "(now 1 of 2)" in lines[0] and "(now 2 of 2)" in lines[1]
    assert not [m for m in caplog.messages if "stepped aside" in m]  # it never waited


def test_the_gpu_lanes_cpu_fallback_shares_the_cores_the_same_way(sharing, r, caplog):
    import torch

    from tasks.chunks import model_chunk, post_chunk, prep_chunk

    _, (chunk_id,) = stored_job(
        sharing, ["my parcel is late", "login fails"], lane="gpu", prefix="g"
    )
    prep_chunk.apply(args=(chunk_id,)).get()
    # The prep stage may be this process's first model load, which sets the environment's
    # thread count (tests run with one): the host's two cores, as the sharing worker had.
    torch.set_num_threads(2)
    r.set(busy_key(), "1", px=60_000)
    with caplog.at_level(logging.INFO, logger="tasks.chunks"):
        model_chunk.apply(args=(chunk_id,)).get()
    assert torch.get_num_threads() == 1
    assert [m for m in caplog.messages if "changed its torch threads" in m and "now 1 of 2" in m]
    r.delete(busy_key())
    post_chunk.apply(args=(chunk_id,)).get()
    with session_scope(sharing) as session:
        assert session.get(Chunk, chunk_id).state == "done"


def test_the_watch_looks_at_redis_at_most_every_look_every_seconds(settings, r, monkeypatch):
    """Micro-batches of a fast model come faster than Redis round trips are worth: between
    two looks the watch answers from its last one, and the next look sees a cancel."""
    import tasks.chunks
    from jobs.lifecycle import cancel_key

    job_id, _ = stored_job(settings, ["one text"], prefix="l")
    monkeypatch.setattr(tasks.chunks, "LOOK_EVERY", 60.0)
    watch = tasks.chunks.CancelWatch(job_id)
    assert watch() is False  # the first micro-batch looks
    r.set(cancel_key(job_id), "1", ex=60)
    assert watch() is False  # not looked again within LOOK_EVERY
    watch.next_look = 0.0  # LOOK_EVERY has passed
    assert watch() is True


def test_the_watch_goes_on_while_redis_is_away_and_sees_a_cancel_once_it_is_back(
    sharing, r, worker_app
):
    """A look that finds no Redis is no cancel and no error (the chunk goes on, with every
    core); the look after Redis is back reads the flag."""
    import tasks.chunks
    from jobs.lifecycle import cancel_key
    from tests.e2e.procs import free_port

    worker_app(sharing)
    job_id, _ = stored_job(sharing, ["one text"], prefix="a")
    watch = tasks.chunks.CancelWatch(job_id, share=True)
    real = watch.redis
    assert watch._look() == (0, False)  # the look's own connection, made on this thread
    watch.redis = redis.Redis(port=free_port(), socket_connect_timeout=1)  # nothing there
    r.set(cancel_key(job_id), "1", ex=60)
    assert watch._look() == (0, False)
    watch.next_look = 0.0
    assert watch() is False
    watch.redis = real  # Redis is back
    watch.next_look = 0.0
    assert watch() is True
