"""Beat's reconciler against the real Postgres and Redis: stalled chunks go round again."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import redis
from sqlalchemy import select

from db.models import Chunk, Job, Result
from db.queries import chunks_of, create_account, create_job, utcnow
from db.session import session_scope
from laneway.planner import plan_chunks
from tasks.maintenance import MAX_CHUNK_ATTEMPTS, finalize_orphaned_jobs, redispatch_stalled_chunks


def _stalled_job(settings, attempts: int, started_ago: timedelta):
    with session_scope(settings) as session:
        account, _ = create_account(session, f"rec-{uuid.uuid4().hex[:8]}", "standard")
        job = create_job(
            session,
            account_id=account.id,
            tasks=["classify"],
            labels=["a", "b"],
            items=[("x", "one"), ("y", "two")],
            lane="cpu",
            chunks=plan_chunks(2, 2),
            chunk_size=2,
        )
        chunk = chunks_of(session, job.id)[0]
        chunk.state, chunk.attempts, chunk.worker = "running", attempts, "cpu@dead"
        chunk.started_at = utcnow() - started_ago
        return job.id, chunk.id, chunk.task_id


def _queued_ids(settings, queue: str) -> set[str]:
    messages = redis.Redis.from_url(settings.redis_url).lrange(queue, 0, -1)
    return {json.loads(m)["headers"]["id"] for m in messages}


def test_a_chunk_running_past_the_visibility_timeout_is_sent_again(settings, migrated):
    job_id, chunk_id, old_task = _stalled_job(settings, 1, timedelta(hours=3))
    fresh_job, fresh_chunk, _ = _stalled_job(settings, 1, timedelta(seconds=5))
    outcome = redispatch_stalled_chunks()
    assert chunk_id in outcome["redispatched"] and fresh_chunk not in outcome["redispatched"]
    with session_scope(settings) as session:
        chunk = session.get(Chunk, chunk_id)
        assert chunk.state == "queued" and chunk.worker is None and chunk.task_id != old_task
        new_task = chunk.task_id
        assert session.get(Chunk, fresh_chunk).state == "running"  # may still be alive
    assert new_task in _queued_ids(settings, "cpu")
    # A second reconciler run (or a second beat) finds nothing more to do for it.
    assert chunk_id not in redispatch_stalled_chunks()["redispatched"]


def test_a_chunk_out_of_attempts_fails_its_items_and_the_job_ends(settings, migrated):
    job_id, chunk_id, _ = _stalled_job(settings, MAX_CHUNK_ATTEMPTS, timedelta(hours=3))
    assert chunk_id in redispatch_stalled_chunks()["failed"]
    assert str(job_id) in finalize_orphaned_jobs()
    with session_scope(settings) as session:
        errors = session.scalars(select(Result.error).where(Result.job_id == job_id)).all()
        assert len(errors) == 2 and all("gave up after" in e for e in errors)
        assert session.get(Job, job_id).status == "failed"
