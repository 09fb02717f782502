"""The gpu lane's split stages against the real Postgres and Redis, run in this process.

Each stage is called the way a worker calls it (`Task.apply`), without a broker: the point
here is the hand-off through Redis and the fallbacks when a hand-off is missing.
"""

from __future__ import annotations

import pytest
import redis
from sqlalchemy import select

from db.models import Chunk, Job, Result
from db.session import session_scope
from tasks.chunks import _key, model_chunk, post_chunk, prep_chunk
from tests.factories import stored_job

TEXTS = ["my parcel is late", "refund $20 to a@b.co please", "love the new app", "login fails"]


@pytest.fixture
def gpu_chunk(settings, migrated):
    job_id, (chunk_id,) = stored_job(
        settings,
        TEXTS,
        lane="gpu",
        account_type="enterprise",
        tasks=["classify", "score", "extract"],
        labels=["shipping", "billing", "praise", "account"],
        prefix="s",
    )
    return chunk_id, job_id


def _results(settings, job_id):
    with session_scope(settings) as session:
        return {
            r.item_id: r.output
            for r in session.scalars(select(Result).where(Result.job_id == job_id))
        }


def test_split_stages_hand_off_through_redis(settings, gpu_chunk):
    chunk_id, job_id = gpu_chunk
    r = redis.Redis.from_url(settings.redis_url)
    prep_chunk.apply(args=(chunk_id,)).get()
    assert r.exists(_key(chunk_id, "prepared"))
    model_chunk.apply(args=(chunk_id,)).get()
    assert r.exists(_key(chunk_id, "raw"))
    with session_scope(settings) as session:
        chunk = session.get(Chunk, chunk_id)
        # Handed on: queued for its post stage, held by no worker between stages.
        assert (chunk.state, chunk.stage, chunk.attempts) == ("queued", "post", 1)
        assert chunk.worker_instance is None
        assert chunk.pre_seconds > 0 and chunk.model_seconds > 0 and chunk.device == "cpu"
    post_chunk.apply(args=(chunk_id,)).get()
    assert not r.exists(_key(chunk_id, "prepared"), _key(chunk_id, "raw"))
    results = _results(settings, job_id)
    assert set(results) == {"s0", "s1", "s2", "s3"}
    assert all(
        {"label", "score", "scores", "rating", "entities"} <= set(o) for o in results.values()
    )
    with session_scope(settings) as session:
        chunk = session.get(Chunk, chunk_id)
        assert chunk.state == "done" and chunk.post_seconds > 0
        # Its last chunk done, the job settled at once (no need to wait for the chord).
        assert session.get(Job, job_id).status == "succeeded"
    # A redelivered stage after the chunk is done changes nothing.
    assert post_chunk.apply(args=(chunk_id,)).get() == {"chunk": chunk_id, "skipped": True}
    assert model_chunk.apply(args=(chunk_id,)).get() == {"chunk": chunk_id, "skipped": True}


def test_lost_hand_offs_are_recomputed_not_lost(settings, gpu_chunk):
    chunk_id, job_id = gpu_chunk
    r = redis.Redis.from_url(settings.redis_url)
    prep_chunk.apply(args=(chunk_id,)).get()
    r.delete(_key(chunk_id, "prepared"))  # as if Redis had been emptied
    model_chunk.apply(args=(chunk_id,)).get()  # tokenizes for itself
    r.delete(_key(chunk_id, "raw"))
    post_chunk.apply(args=(chunk_id,)).get()  # runs every stage itself
    results = _results(settings, job_id)
    assert len(results) == 4 and all("label" in o for o in results.values())


def test_a_stale_stage_message_is_skipped(settings, gpu_chunk):
    chunk_id, _ = gpu_chunk
    prep_chunk.apply(args=(chunk_id,)).get()
    model_chunk.apply(args=(chunk_id,)).get()
    # A redelivered prep or model message for a chunk already waiting for post.
    assert prep_chunk.apply(args=(chunk_id,)).get() == {"chunk": chunk_id, "skipped": True}
    assert model_chunk.apply(args=(chunk_id,)).get() == {"chunk": chunk_id, "skipped": True}
    with session_scope(settings) as session:
        assert session.get(Chunk, chunk_id).attempts == 1


def test_a_late_duplicate_never_overwrites_a_finished_chunk(settings, gpu_chunk):
    from core.util.isolate import Failure
    from db.common import chunk_items
    from jobs.chunks import Work
    from tasks.chunks import _finish

    chunk_id, job_id = gpu_chunk
    with session_scope(settings) as session:  # a second copy read the chunk while open
        chunk = session.get(Chunk, chunk_id)
        items = [(i.idx, i.item_id, i.text) for i in chunk_items(session, chunk)]
        duplicate = Work(chunk_id, job_id, ["classify"], ["a", "b"], items, 1, "cpu")
    for stage in (prep_chunk, model_chunk, post_chunk):
        stage.apply(args=(chunk_id,)).get()
    good = _results(settings, job_id)
    late = [Failure("SoftTimeLimitExceeded: late", "")] * len(items)
    outcome = _finish(duplicate, [None] * len(items), late)
    assert outcome == {"chunk": chunk_id, "skipped": True}
    assert _results(settings, job_id) == good
