"""A job's chunks sized from its lane's measured speed (jobs/planner.chunk_size_for), against
the real Postgres: what `worker_speed` reads from finished chunks, and what `submit_job`
writes (the job's chunk size, its chunks, and the record of how the size was chosen)."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import select

from db.common import utcnow
from db.models import Chunk, Job
from db.session import session_scope
from jobs.lanes import MIN_MEASURED_ITEMS, worker_speed
from jobs.submit import submit_job
from tests.factories import add_worker, stored_job

# Task lists no other test's jobs run, so their chunks never enter these measurements.
TASKS = ["score", "extract"]
OTHER_TASKS = ["embed", "extract"]


def finish(settings, chunk_ids, pre, model, post, device="cpu") -> None:
    """Mark chunks done, as a worker would, with these stage seconds each."""
    with session_scope(settings) as session:
        for chunk_id in chunk_ids:
            chunk = session.get(Chunk, chunk_id)
            chunk.state, chunk.finished_at, chunk.device = "done", utcnow(), device
            chunk.pre_seconds, chunk.model_seconds, chunk.post_seconds = pre, model, post


def speed(settings, lane, tasks=TASKS):
    with session_scope(settings) as session:
        return worker_speed(session, lane, tasks)


def items_of(n, prefix="t"):
    return [(f"{prefix}{i}", f"text {i}") for i in range(n)]


def test_a_worker_s_speed_is_read_from_its_lane_s_latest_chunks_of_the_same_tasks(
    settings, migrated
):
    # 600 items in chunks of 60: 0.1 + 0.4 + 0.1 s each, 100 items/s.
    _, chunks = stored_job(settings, ["x"] * 600, chunk_size=60, tasks=TASKS)
    assert speed(settings, "cpu") is None  # nothing finished yet
    finish(settings, chunks[:5], 0.1, 0.4, 0.1)
    assert speed(settings, "cpu") is None  # 300 items: under MIN_MEASURED_ITEMS
    assert MIN_MEASURED_ITEMS <= 600
    finish(settings, chunks[5:], 0.1, 0.4, 0.1)
    assert speed(settings, "cpu") == pytest.approx(100.0)
    # Chunks the result cache answered whole ran no stage: they say nothing of the speed.
    _, cached = stored_job(settings, ["x"] * 600, chunk_size=60, tasks=TASKS)
    finish(settings, cached, 0.0, 0.0, 0.0)
    assert speed(settings, "cpu") == pytest.approx(100.0)
    # Another task list's chunks, and another lane's, are not this one's speed.
    _, other = stored_job(settings, ["x"] * 600, chunk_size=60, tasks=["score"])
    finish(settings, other, 0.0, 0.01, 0.0)
    assert speed(settings, "cpu") == pytest.approx(100.0)
    assert speed(settings, "cpu", ["score"]) == pytest.approx(6000.0)
    assert speed(settings, "gpu") is None
    # The gpu lane's worker holds a chunk for its model stage alone: that is its speed.
    _, gpu = stored_job(settings, ["x"] * 600, chunk_size=300, tasks=TASKS, lane="gpu")
    finish(settings, gpu, 0.5, 0.03, 0.5, device="cuda")
    assert speed(settings, "gpu") == pytest.approx(10_000.0)


def test_a_submitted_job_is_cut_from_the_measured_speed_and_says_so(
    settings, migrated, account_factory
):
    account, _ = account_factory("standard")
    add_worker(settings, ["cpu", "maintenance"])
    sizing = settings.replace(
        chunk_seconds=1.0, chunk_size=16, max_chunk_size=512, gpu_threshold=100_000
    )
    # Unmeasured: LANEWAY_CHUNK_SIZE, as before.
    first = submit_job(account, items_of(640), tasks=OTHER_TASKS, settings=sizing)
    assert first.lane == "cpu"
    assert first.chunk_size == 16
    assert first.routing["chunking"]["worker_items_per_second"] is None
    with session_scope(settings) as session:
        ids = list(session.scalars(select(Chunk.id).where(Chunk.job_id == first.id)))
    finish(settings, ids, 0.01, 0.06, 0.01)  # 16 items in 0.08 s: 200 items/s
    second = submit_job(account, items_of(5000, "u"), tasks=OTHER_TASKS, settings=sizing)
    chunking = second.routing["chunking"]
    assert chunking["worker_items_per_second"] == pytest.approx(200.0)
    workers = chunking["workers"]
    assert workers >= 1  # the worker registered above, at least
    expected = max(16, min(200, 512, math.ceil(5000 / (2 * workers))))
    assert second.chunk_size == chunking["size"] == expected
    with session_scope(settings) as session:
        stored = session.get(Job, second.id)
        spans = list(
            session.scalars(select(Chunk.stop - Chunk.start).where(Chunk.job_id == second.id))
        )
        assert stored.chunk_size == expected
    assert sum(spans) == 5000 and max(spans) == expected
    assert len(spans) == math.ceil(5000 / expected)
    # LANEWAY_CHUNK_SECONDS=0: every chunk LANEWAY_CHUNK_SIZE items, whatever was measured.
    fixed = submit_job(
        account, items_of(5000, "v"), tasks=OTHER_TASKS, settings=sizing.replace(chunk_seconds=0.0)
    )
    assert fixed.chunk_size == 16
    assert fixed.routing["chunking"]["worker_items_per_second"] is None


def test_a_lane_s_speed_is_read_among_the_newest_chunks_only(settings, migrated, monkeypatch):
    """However large the chunks table, a submission's look is bounded: a lane whose last
    chunks are older than the newest SCANNED_CHUNKS of every lane counts as unmeasured."""
    import jobs.lanes

    tasks = ["embed", "score"]  # a task list no other test runs
    _, measured = stored_job(settings, ["x"] * 600, chunk_size=60, tasks=tasks)
    finish(settings, measured, 0.1, 0.4, 0.1)
    assert speed(settings, "cpu", tasks) == pytest.approx(100.0)
    monkeypatch.setattr(jobs.lanes, "SCANNED_CHUNKS", 15)
    assert speed(settings, "cpu", tasks) == pytest.approx(100.0)  # its 10 are the newest
    stored_job(settings, ["y"] * 160, chunk_size=16, tasks=["classify"])  # 10 newer chunks
    assert speed(settings, "cpu", tasks) is None  # 5 of its 10 in the window: 300 items
