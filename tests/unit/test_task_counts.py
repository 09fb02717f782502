"""A pool process's chunk task starts and ends (workers/registry.py `TaskCounts`): one that
Postgres refused is recorded once it answers, in order with those after it, so that the
worker is not left counted busy (beat would never stop an idle gpu worker)."""

from __future__ import annotations

import logging

from workers.registry import TaskCounts


class Postgres:
    """What `record` meets: away for the first `away` calls, then answering; the records
    it took, in order."""

    def __init__(self, away: int) -> None:
        self.away = away
        self.taken: list[tuple[str, bool]] = []
        self.calls = 0

    def record(self, instance: str, started: bool) -> None:
        self.calls += 1
        if self.calls <= self.away:
            raise ConnectionError("Postgres is away")
        self.taken.append((instance, started))


def drained(counts: TaskCounts) -> None:
    thread = counts._thread
    assert thread is not None
    thread.join(timeout=10)
    assert not thread.is_alive() and counts.pending() == 0


def test_with_postgres_answering_each_is_recorded_at_once():
    pg = Postgres(away=0)
    counts = TaskCounts(pg.record, retry_every=0.01)
    counts.add("w1", True)
    counts.add("w1", False)
    assert pg.taken == [("w1", True), ("w1", False)] and counts._thread is None


def test_an_end_refused_by_postgres_is_recorded_once_it_answers(caplog):
    pg = Postgres(away=3)  # the end's first try and two of the retries' fail
    counts = TaskCounts(pg.record, retry_every=0.01)
    with caplog.at_level(logging.WARNING, logger="workers.registry"):
        counts.add("w1", False)
    assert "could not record a chunk task's end (ConnectionError)" in caplog.text
    drained(counts)
    assert pg.taken == [("w1", False)]


def test_what_follows_a_refused_one_waits_behind_it_in_order():
    """A start refused, then its end with Postgres back: the end must not be counted
    before the start (the count would stay at one, the worker busy for good)."""
    pg = Postgres(away=1)
    counts = TaskCounts(pg.record, retry_every=3600)  # retried only when woken below
    counts.add("w1", True)  # refused
    counts.add("w1", False)  # Postgres answers now, but the start is still waiting
    counts.add("w1", True)
    assert pg.taken == [] and counts.pending() == 3
    counts._wake.set()
    drained(counts)
    assert pg.taken == [("w1", True), ("w1", False), ("w1", True)]
    counts.add("w1", False)  # nothing waits: recorded at once again
    assert pg.taken[-1] == ("w1", False) and counts.pending() == 0
