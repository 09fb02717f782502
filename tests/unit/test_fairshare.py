"""Fair share's rule (jobs/fairshare.allocate, lane_clock, window): pure arithmetic, no service."""

from __future__ import annotations

import uuid
from collections import Counter
from types import SimpleNamespace

import pytest

from core.config.settings import Settings
from jobs.fairshare import Standing, allocate, serving, window


def job(chunks: int, size: int = 256) -> list:
    return [uuid.uuid4(), chunks, size]


class Lane:
    """A lane giving `slots` slots per round; each given chunk runs and ends before the
    next round (its items leave the account's in-flight count: the worst case, a lane
    with nothing in flight between a chunk's end and its refill), passes and the clock
    carried over as a refill stores them."""

    def __init__(self) -> None:
        self.clock = 0.0


def run_lane(
    accounts: list[Standing], rounds: int, slots: int = 1, lane: Lane | None = None
) -> Counter:
    """Returns the chunks each account got."""
    lane = lane or Lane()
    got: Counter = Counter()
    owner = {j[0]: a.account_id for a in accounts for j in a.jobs}
    for _ in range(rounds):
        before = {a.account_id: a.in_flight_items for a in accounts}
        given = allocate(accounts, slots, lane.clock)
        picks, start, lane.clock = given.picks, given.start, given.clock
        for a in accounts:
            given = a.in_flight_items - before[a.account_id]
            if given:
                a.passed = start[a.account_id] + given / a.weight
            a.in_flight_items = 0
            for j in a.jobs:
                j[1] -= sum(p == j[0] for p in picks)
            a.jobs = [j for j in a.jobs if j[1] > 0]
        got.update(owner[p] for p in picks)
    return got


def test_an_account_alone_gets_every_slot():
    alone = Standing(1, 1.0, 0.0, jobs=[job(100)])
    assert len(allocate([alone], 8, 0.0).picks) == 8


def test_two_equal_accounts_alternate_even_one_slot_at_a_time():
    a = Standing(1, 1.0, 0.0, jobs=[job(1000)])
    b = Standing(2, 1.0, 0.0, jobs=[job(1000)])
    got = run_lane([a, b], rounds=100)
    assert got == {1: 50, 2: 50}


@pytest.mark.parametrize("slots", [1, 2, 3, 8])
def test_weights_three_to_one_give_three_quarters_whatever_the_window(slots):
    heavy = Standing(1, 3.0, 0.0, jobs=[job(10_000)])
    light = Standing(2, 1.0, 0.0, jobs=[job(10_000)])
    got = run_lane([heavy, light], rounds=400 // slots, slots=slots)
    assert got[1] / (got[1] + got[2]) == pytest.approx(0.75, abs=0.01)


def test_a_newcomer_goes_before_the_next_chunk_of_an_account_already_served():
    # The big account has been served alone for a long time: its last chunk started at
    # the clock, its pass is one chunk past it.
    big = Standing(1, 1.0, 1_000_256.0, in_flight_items=512, jobs=[job(5000)])
    small = Standing(2, 1.0, 0.0, jobs=[job(2, 150)])
    given = allocate([big, small], 2, 1_000_000.0)
    assert given.picks == [small.jobs[0][0], small.jobs[0][0]]
    # It starts at the lane's clock (no credit for the time it was away), not at 0.
    assert given.start[2] == 1_000_000.0


def test_an_account_back_from_idle_gets_no_credit_for_its_absence():
    lane = Lane()
    busy = Standing(1, 1.0, 0.0, jobs=[job(1000)])
    assert run_lane([busy], rounds=200, lane=lane) == {1: 200}  # alone: its pass runs ahead
    back = Standing(2, 1.0, 10.0, jobs=[job(1000)])  # served long ago: a low pass
    got = run_lane([busy, back], rounds=40, lane=lane)
    assert 19 <= got[2] <= 21, got  # about half, not every slot until it catches up


def test_within_an_account_the_oldest_job_goes_first():
    old, new = job(2), job(2)
    account = Standing(1, 1.0, 0.0, jobs=[old, new])
    assert allocate([account], 3, 0.0).picks == [old[0], old[0], new[0]]


def test_no_slot_is_given_to_nothing():
    assert allocate([], 4, 7.0).picks == []
    done = Standing(1, 1.0, 0.0, in_flight_items=256, jobs=[])
    assert allocate([done], 4, 0.0).picks == []


def test_a_weight_change_takes_effect_at_the_next_allocation():
    lane = Lane()
    a = Standing(1, 1.0, 0.0, jobs=[job(10_000)])
    b = Standing(2, 1.0, 0.0, jobs=[job(10_000)])
    assert run_lane([a, b], rounds=20, lane=lane) == {1: 10, 2: 10}
    a.weight = 4.0
    got = run_lane([a, b], rounds=100, lane=lane)
    assert got[1] / 100 == pytest.approx(0.8, abs=0.03)


def test_the_window_follows_the_workers_within_its_bounds():
    settings = Settings(window_per_worker=2, min_window=4, lane_limit_cpu=50)
    assert window(settings, "cpu", 0) == 4  # no worker yet: work still shows as waiting
    assert window(settings, "cpu", 3) == 6
    assert window(settings, "cpu", 100) == 50


def test_the_gpu_lane_is_served_by_gpu_and_cpu_workers():
    workers = [SimpleNamespace(queues=q) for q in (["cpu", "maintenance"], ["gpu"], ["cpu"])]
    assert serving(workers, "cpu") == 2
    assert serving(workers, "gpu") == 3


def test_a_weight_written_by_hand_out_of_range_is_held_to_it():
    from db.accounts import weight_in_effect

    settings = Settings(share_weight_trial=1)
    assert weight_in_effect("trial", None, settings) == (1.0, True)
    assert weight_in_effect("trial", 5e-324, settings) == (0.001, False)  # not an infinite pass
    assert weight_in_effect("trial", 1e300, settings) == (1000.0, False)
    tiny = Standing(1, weight_in_effect("trial", 5e-324, settings)[0], 0.0, jobs=[job(10)])
    other = Standing(2, 1.0, 0.0, jobs=[job(10)])
    given = allocate([tiny, other], 4, 0.0)
    assert given.clock < float("inf") and len(given.picks) == 4
