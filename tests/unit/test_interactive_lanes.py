"""Which lane an interactive request goes to: the policy, and the per-process view of the
interactive gpu workers (a fake registry and clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.later import Later
from webapp.interactive_client import LaneChooser, choose_lane


def test_auto_prefers_a_live_gpu_worker_and_a_set_lane_is_kept():
    assert choose_lane("auto", gpu_live=True) == "gpu"
    assert choose_lane("auto", gpu_live=False) == "cpu"
    assert choose_lane("cpu", gpu_live=True) == "cpu"
    assert choose_lane("gpu", gpu_live=False) == "gpu"


class Registry:
    """Heartbeats of interactive gpu workers, as the registry would answer."""

    def __init__(self) -> None:
        self.beats: list[datetime] = []
        self.reads: list[datetime] = []
        self.down = False

    def served_since(self, since: datetime) -> bool:
        self.reads.append(since)
        if self.down:
            raise ConnectionError("postgres is away")
        return any(beat >= since for beat in self.beats)


@pytest.fixture
def clock():
    now = [datetime(2026, 11, 24, 12, 0, tzinfo=UTC)]

    def tick(seconds: float = 0.0) -> datetime:
        now[0] += timedelta(seconds=seconds)
        return now[0]

    return tick


def test_the_registry_is_read_at_most_once_per_refresh(clock):
    registry = Registry()
    chooser = LaneChooser(registry.served_since, dead_after=20, refresh=2, clock=clock)
    registry.beats.append(clock())
    assert chooser.gpu_live() and chooser.gpu_live()
    assert len(registry.reads) == 1
    clock(2.5)
    assert chooser.gpu_live() and len(registry.reads) == 2
    # Heartbeats older than dead_after do not count: the worker is gone.
    clock(30)
    assert not chooser.gpu_live()


def test_a_missed_answer_moves_traffic_to_cpu_until_a_worker_beats_again(clock):
    registry = Registry()
    chooser = LaneChooser(registry.served_since, dead_after=20, refresh=2, clock=clock)
    registry.beats.append(clock())
    assert chooser.gpu_live()
    clock(1)
    chooser.missed()  # e.g. the worker was killed; its last beat is still recent
    assert not chooser.gpu_live()  # read again at once, not after the refresh
    clock(3)
    assert not chooser.gpu_live()  # its old beat no longer vouches for it
    registry.beats.append(clock(1))  # a worker beats after the miss
    clock(2)
    assert chooser.gpu_live()


def test_a_registry_that_cannot_be_read_sends_to_cpu(clock):
    registry = Registry()
    registry.beats.append(clock())
    registry.down = True
    chooser = LaneChooser(registry.served_since, dead_after=20, refresh=2, clock=clock)
    assert not chooser.gpu_live()
    registry.down = False
    clock(2)
    assert chooser.gpu_live()


def test_a_due_read_runs_ahead_and_requests_go_on_with_the_last_answer(clock):
    registry, later = Registry(), Later()
    chooser = LaneChooser(registry.served_since, 20, refresh=2, clock=clock, ahead=later)
    registry.beats.append(clock())
    assert chooser.gpu_live() and len(registry.reads) == 1  # the first read: inline
    clock(2.5)
    registry.beats.clear()
    clock(30)  # the worker is gone, but no read has said so yet
    assert chooser.gpu_live() and chooser.gpu_live()  # one read queued, none inline
    assert len(registry.reads) == 1 and len(later.jobs) == 1
    later.run()
    assert not chooser.gpu_live() and len(registry.reads) == 2


def test_a_read_begun_before_a_miss_does_not_bring_the_gpu_lane_back(clock):
    registry, later = Registry(), Later()
    chooser = LaneChooser(registry.served_since, 20, refresh=2, clock=clock, ahead=later)
    registry.beats.append(clock())
    assert chooser.gpu_live()
    clock(2.5)
    registry.beats.append(clock())
    assert chooser.gpu_live()  # a read queued; it will find the beat
    clock(0.5)
    chooser.missed()  # meanwhile a request went unanswered on the gpu lane
    later.run()
    assert chooser.live is False
    assert not chooser.gpu_live()  # read again inline, since the miss: no beat since
    clock(1)
    registry.beats.append(clock())
    clock(2.5)
    assert chooser.gpu_live() is False  # the last answer, while the due read runs ahead
    later.run()
    assert chooser.gpu_live()  # a worker beat after the miss: trusted again
