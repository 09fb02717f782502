"""How a batch worker shares its host's cores (workers/cores.py), as pure logic: the
thread policy with a recorded setter, the wait with a fake clock and mark reader."""

from __future__ import annotations

import pytest

from workers.cores import CoreShare, StepAside


def share(cores: int, threads: int) -> tuple[CoreShare, list[int]]:
    calls: list[int] = []
    return CoreShare(cores, set_threads=calls.append, threads=threads), calls


def test_every_core_while_the_host_is_idle_one_fewer_while_it_is_busy():
    cores, calls = share(4, threads=4)
    assert [cores(busy=b) for b in (False, True, True, False, False)] == [4, 3, 3, 4, 4]
    # Set only when the count must change: once to give a core back, once to take it.
    assert calls == [3, 4] and cores.changes == 2 and cores.threads == 4


def test_a_worker_that_started_short_takes_its_cores_at_the_first_idle_batch():
    cores, calls = share(2, threads=1)
    assert cores(busy=False) == 2 and calls == [2]


@pytest.mark.parametrize("configured", [1, 0, -3])
def test_one_core_is_never_given_away(configured):
    cores, calls = share(configured, threads=1)
    assert [cores(busy=b) for b in (True, False, True)] == [1, 1, 1]
    assert calls == [] and cores.changes == 0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds


def marks(*left_ms: int):
    """A mark reader that answers these values in turn, then 'no mark'."""
    answers = iter(left_ms)
    return lambda: next(answers, 0)


def test_a_mark_already_read_costs_no_second_look_and_no_wait_when_absent():
    clock = Clock()
    aside = StepAside(None, 5.0, clock=clock, sleep=clock.sleep, look=marks(999))
    assert aside(left_ms=0) == 0.0 and not aside.busy and clock.now == 0.0


def test_it_waits_out_a_renewed_mark_and_then_counts_as_idle():
    clock = Clock()
    aside = StepAside(None, 5.0, clock=clock, sleep=clock.sleep, look=marks(300, 200))
    waited = aside(left_ms=250)
    # 250 ms, then the renewed 300 and 200: the batch goes on once the mark lapsed.
    assert waited == pytest.approx(0.75) and not aside.busy and aside.paused == waited


def test_past_its_longest_wait_it_goes_on_still_busy_so_with_a_core_fewer():
    clock = Clock()
    aside = StepAside(None, 1.0, clock=clock, sleep=clock.sleep, look=marks(*[300] * 10))
    cores, calls = share(2, threads=2)
    waited = aside(left_ms=300)
    assert waited == pytest.approx(1.0) and aside.busy
    assert cores(busy=aside.busy) == 1 and calls == [1]


def test_without_waiting_allowed_a_standing_mark_still_counts_as_busy():
    clock = Clock()
    aside = StepAside(None, 0.0, clock=clock, sleep=clock.sleep, look=marks())
    assert aside(left_ms=5000) == 0.0 and aside.busy and clock.now == 0.0
    assert aside(left_ms=0) == 0.0 and not aside.busy
