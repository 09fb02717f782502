"""Fair share on real Postgres and Redis (no worker): what a lane's refill sends, to whom,
and what it leaves waiting. The chunks a test "runs" are finished through jobs/chunks.py,
as a worker would."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from datetime import timedelta

import pytest
import redis
from sqlalchemy import select

from db.common import utcnow
from db.models import Account, Chunk, Job
from db.session import session_scope
from jobs import chunks, fairshare
from jobs.lifecycle import LaneFull, admit, cancel_job, retry_dead_letters
from tests.factories import stored_job

pytestmark = pytest.mark.usefixtures("no_worker_up")


def held_job(settings, n_chunks: int, *, chunk_size: int = 4, account_type: str = "standard"):
    """A job as submission stores it (every chunk held), of an account of its own."""
    texts = [f"text {n}" for n in range(n_chunks * chunk_size)]
    job_id, chunk_ids = stored_job(
        settings, texts, chunk_size=chunk_size, account_type=account_type, held=True
    )
    return job_id, chunk_ids


def account_of(settings, job_id) -> int:
    with session_scope(settings) as session:
        return session.get(Job, job_id).account_id


def states(settings, job_id) -> Counter:
    with session_scope(settings) as session:
        return Counter(session.scalars(select(Chunk.state).where(Chunk.job_id == job_id)))


def in_flight(settings, lane: str = "cpu") -> list[Chunk]:
    with session_scope(settings) as session:
        found = list(
            session.scalars(
                select(Chunk)
                .where(Chunk.queue == lane, Chunk.state.in_(("queued", "running")))
                .order_by(Chunk.id)
            )
        )
        session.expunge_all()
        return found


def sent_ids(settings, queue: str = "cpu") -> list[str]:
    r = redis.Redis.from_url(settings.redis_url)
    return [json.loads(m)["headers"]["id"] for m in r.lrange(queue, 0, -1)]


def finish_in_flight(settings) -> Counter:
    """Every chunk in flight on the cpu lane ends, as its worker would record it; returns
    the chunks each job got."""
    ended: Counter = Counter()
    for chunk in in_flight(settings):
        with session_scope(settings) as session:
            row = session.get(Chunk, chunk.id)
            row.state, row.finished_at = "done", utcnow()
            row.started_at = row.finished_at - timedelta(seconds=1)
        ended[chunk.job_id] += 1
    return ended


def serve(settings, rounds: int) -> Counter:
    """Rounds of a lane whose chunks all end between refills; the chunks each job got."""
    got: Counter = Counter()
    for _ in range(rounds):
        fairshare.refill(settings, "cpu")
        got += finish_in_flight(settings)
    return got


def set_weight(settings, job_id, weight) -> None:
    with session_scope(settings) as session:
        session.get(Account, account_of(settings, job_id)).share_weight = weight


def test_a_lane_sends_only_its_window_and_the_rest_waits_unsent(settings):
    big, big_chunks = held_job(settings, 50)
    assert fairshare.refill(settings, "cpu") == settings.min_window  # no worker: the minimum
    flying = in_flight(settings)
    assert [c.id for c in flying] == big_chunks[: settings.min_window]  # in order
    assert sorted(sent_ids(settings)) == sorted(c.task_id for c in flying)
    assert states(settings, big) == {"queued": 4, "held": 46}
    assert fairshare.refill(settings, "cpu") == 0  # full: nothing more is sent


def test_two_accounts_with_work_waiting_share_the_lane_equally(settings):
    a, _ = held_job(settings, 40)
    b, _ = held_job(settings, 40)
    got = serve(settings, 10)
    assert got[a] == got[b] == 20


def test_weights_three_to_one_give_the_heavier_three_quarters(settings):
    heavy, _ = held_job(settings, 100)
    light, _ = held_job(settings, 100)
    set_weight(settings, heavy, 3.0)
    set_weight(settings, light, 1.0)  # both overridden: a standard account weighs 2
    got = serve(settings, 16)
    assert got[heavy] / (got[heavy] + got[light]) == 0.75


def test_an_account_type_weighs_what_settings_say_and_its_own_weight_overrides(settings):
    enterprise, _ = held_job(settings, 100, account_type="enterprise")
    trial, _ = held_job(settings, 100, account_type="trial")
    weighted = settings.replace(share_weight_enterprise=3, share_weight_trial=1)
    got = serve(weighted, 8)
    assert (got[enterprise], got[trial]) == (24, 8)
    set_weight(settings, trial, 3.0)  # the operator's change, read at the next refill
    got = serve(weighted, 8)
    assert got[enterprise] == got[trial] == 16


def test_a_small_job_goes_out_at_the_next_free_slot_behind_a_huge_one(settings):
    huge, _ = held_job(settings, 500)
    serve(settings, 20)  # the huge job has had the lane to itself for a while
    fairshare.refill(settings, "cpu")
    small, small_chunks = held_job(settings, 2)
    assert fairshare.refill(settings, "cpu") == 0  # the window is full: it waits its turn
    first = in_flight(settings)[0]
    with session_scope(settings) as session:
        row = session.get(Chunk, first.id)
        row.state = "done"  # one slot frees
    assert fairshare.refill(settings, "cpu") == 1
    assert in_flight(settings)[-1].id == small_chunks[0]  # the small job's, not the huge one's
    assert states(settings, huge)["held"] > 0


def test_cancelling_a_job_takes_its_waiting_chunks_out_of_the_share(settings):
    a, _ = held_job(settings, 20)
    b, _ = held_job(settings, 20)
    fairshare.refill(settings, "cpu")
    cancel_job(a, settings)
    assert states(settings, a)["held"] == 0
    finish_in_flight(settings)
    fairshare.refill(settings, "cpu")
    assert {c.job_id for c in in_flight(settings)} == {b}


def test_concurrent_refills_never_pass_the_window_nor_send_a_chunk_twice(settings):
    for _ in range(6):
        held_job(settings, 10)
    barrier = threading.Barrier(4)
    sent: list[int] = []

    def refill() -> None:
        barrier.wait()
        sent.append(fairshare.refill(settings, "cpu"))

    threads = [threading.Thread(target=refill) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(sent) == settings.min_window
    assert len(in_flight(settings)) == settings.min_window
    ids = sent_ids(settings)
    assert len(ids) == len(set(ids)) == settings.min_window


def test_the_waiting_room_is_bounded_per_lane(settings):
    held_job(settings, 10, chunk_size=4)  # 40 items waiting on the cpu lane
    with session_scope(settings) as session:
        assert fairshare.waiting_items(session, "cpu") == 40
        admit(session, settings.replace(hold_limit=45), "cpu", 5)
        try:
            admit(session, settings.replace(hold_limit=45), "cpu", 6)
        except LaneFull as exc:
            assert "cpu lane" in str(exc)
        else:
            raise AssertionError("a job past the hold limit was admitted")
        admit(session, settings.replace(hold_limit=45), "gpu", 45)  # the other lane's own


def test_dead_letters_sent_back_wait_for_a_slot_like_any_chunk(settings):
    job_id, chunk_ids = stored_job(settings, ["a", "b"], chunk_size=2)
    claimed = chunks.claim(settings, chunk_ids[0], "run", hostname="h", instance="i")
    from core.util.isolate import Failure

    chunks.finish(settings, claimed.work, [None, {"label": "x"}], [Failure("boom", ""), None])
    from jobs.lifecycle import settle

    settle(job_id, settings)
    with session_scope(settings) as session:  # the lane is full of another job's chunks
        session.get(Job, job_id)
    other, _ = held_job(settings, 20)
    fairshare.refill(settings, "cpu")
    retried = retry_dead_letters(job_id, settings=settings)
    assert retried.jobs == {str(job_id): 1}
    assert states(settings, job_id)["held"] == 1  # no slot yet: waiting, not sent
    finish_in_flight(settings)
    fairshare.refill(settings, "cpu")
    assert states(settings, job_id)["queued"] == 1
    assert states(settings, other)["queued"] == settings.min_window - 1


def test_every_lane_is_refilled_by_the_reconcilers_round(settings):
    cpu_job, _ = held_job(settings, 6)
    gpu_job, gpu_chunks = stored_job(
        settings, [f"t{n}" for n in range(24)], lane="gpu", chunk_size=4, held=True
    )
    sent = fairshare.refill_all(settings)
    assert sent == {"cpu": 4, "gpu": 4}
    with session_scope(settings) as session:
        first = session.get(Chunk, gpu_chunks[0])
        assert (first.state, first.stage) == ("queued", "prep")  # its first stage, on cpu
    assert first.task_id + "-prep" in sent_ids(settings, "cpu")
    assert uuid.UUID(str(cpu_job))


def test_a_waiting_job_shows_its_place_and_the_lane_its_shares(settings):
    big, _ = held_job(settings, 30, account_type="enterprise")
    mine, _ = held_job(settings, 3, account_type="trial")
    weighted = settings.replace(share_weight_enterprise=3, share_weight_trial=1)
    fairshare.refill(weighted, "cpu")
    finish_in_flight(settings)  # a recent throughput to estimate from
    fairshare.refill(weighted, "cpu")
    with session_scope(settings) as session:
        board = fairshare.lane_board(session, weighted, "cpu")
        assert board.window == settings.min_window and board.in_flight_chunks == 4
        assert board.by_type()["enterprise"]["share"] == 0.75
        assert board.by_type()["trial"]["share"] == 0.25
        assert board.in_flight_items + board.waiting_items == (30 + 3 - 4) * 4
        job = session.get(Job, big)
        place = fairshare.job_place(session, weighted, job)
    assert place["share"] == 0.75
    assert place["chunks_ahead"] == 4  # the lane's in flight; no older job of its account
    assert place["waiting_chunks"] == states(settings, big)["held"]
    assert place["lane_items_per_second"] is not None
    assert place["estimated_start"] < place["estimated_end"]
    finish_in_flight(settings)
    cancel_job(mine, settings)
    with session_scope(settings) as session:
        assert fairshare.job_place(session, weighted, session.get(Job, mine)) is None
