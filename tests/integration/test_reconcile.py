"""Beat's reconciler against the real Postgres and Redis (no workers): what Postgres says
should be happening is compared with what the broker and the heartbeats say is."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import timedelta

import pytest
import redis
from sqlalchemy import select

from core.queueing.broker import UNACKED, UNACKED_INDEX
from db.common import utcnow
from db.models import Chunk, DeadLetter, Job, JobEvent, Result, Worker
from db.session import session_scope
from jobs.chunks import attempt_limit
from jobs.lifecycle import cancel_job
from tasks.maintenance import finalize_orphaned_jobs, mark_dead_workers, recover_chunks
from tests.broker import empty_queues
from tests.factories import stored_job


@pytest.fixture
def broker(settings):
    """This run's Redis db with empty queues: the reconciler reads what the broker holds."""
    empty_queues(settings, unacked=True)
    yield redis.Redis.from_url(settings.redis_url)
    empty_queues(settings, unacked=True)


def make_job(settings, n_items=2, chunk_size=2, status="running", held=False):
    texts = [f"text number {n}" for n in range(n_items)]
    job_id, chunk_ids = stored_job(settings, texts, chunk_size=chunk_size, held=held)
    if not held:
        with session_scope(settings) as session:
            session.get(Job, job_id).status = status
    return job_id, chunk_ids


def set_chunk(settings, chunk_id, **values):
    with session_scope(settings) as session:
        chunk = session.get(Chunk, chunk_id)
        for name, value in values.items():
            setattr(chunk, name, value)
        return chunk.task_id


def get_chunk(settings, chunk_id) -> Chunk:
    with session_scope(settings) as session:
        chunk = session.get(Chunk, chunk_id)
        session.expunge(chunk)
        return chunk


def live_worker(settings, seen_ago: float = 0.0) -> str:
    instance = f"test/{uuid.uuid4().hex[:8]}"
    with session_scope(settings) as session:
        session.add(
            Worker(
                id=instance,
                hostname="cpu@test",
                queues=["cpu"],
                device="cpu",
                pid=1,
                last_seen_at=utcnow() - timedelta(seconds=seen_ago),
            )
        )
    return instance


def waiting_ids(r, queue="cpu") -> set[str]:
    return {json.loads(m)["headers"]["id"] for m in r.lrange(queue, 0, -1)}


def push_message(r, task_id: str, queue="cpu") -> None:
    r.lpush(queue, json.dumps({"headers": {"id": task_id, "task": "laneway.run_chunk"}}))


def deliver_message(r, task_id: str, queue="cpu", delivered_ago: float = 0.0) -> None:
    """What kombu writes when a worker takes a message and has not acknowledged it yet."""
    tag = uuid.uuid4().hex
    message = {"headers": {"id": task_id, "task": "laneway.run_chunk"}}
    r.hset(UNACKED, tag, json.dumps([message, "", queue]))
    r.zadd(UNACKED_INDEX, {tag: time.time() - delivered_ago})


LONG_AGO = timedelta(hours=1)


def test_a_queued_chunk_whose_message_was_lost_is_sent_again(settings, migrated, broker):
    _, (chunk_id,) = make_job(settings)
    old = set_chunk(settings, chunk_id, queued_at=utcnow() - LONG_AGO)
    assert chunk_id in recover_chunks(settings)["redispatched"]
    chunk = get_chunk(settings, chunk_id)
    assert chunk.state == "queued" and chunk.task_id != old
    assert chunk.last_error == "its broker message was lost"
    assert chunk.task_id in waiting_ids(broker)
    # The new message is in the broker: the next round (or a second beat) leaves it be.
    set_chunk(settings, chunk_id, queued_at=utcnow() - LONG_AGO)
    assert chunk_id not in recover_chunks(settings)["redispatched"]


def test_queued_chunks_with_a_message_or_just_sent_are_left_alone(settings, migrated, broker):
    _, (waiting,) = make_job(settings)
    _, (delivered,) = make_job(settings)
    _, (fresh,) = make_job(settings)
    push_message(broker, set_chunk(settings, waiting, queued_at=utcnow() - LONG_AGO))
    deliver_message(broker, set_chunk(settings, delivered, queued_at=utcnow() - LONG_AGO))
    set_chunk(settings, fresh)  # queued just now: its job may not have been sent yet
    assert not {waiting, delivered, fresh} & set(recover_chunks(settings)["redispatched"])


def test_after_redis_came_back_empty_recent_chunks_without_a_message_are_sent_at_once(
    settings, migrated, broker
):
    """Beat saw Redis empty: a chunk queued seconds before has no grace to wait out, but one
    whose message is back in the broker, or one queued after the emptying, is left be."""
    _, (lost,) = make_job(settings)
    _, (resent,) = make_job(settings)
    _, (later,) = make_job(settings)
    set_chunk(settings, lost, queued_at=utcnow() - timedelta(seconds=3))
    push_message(broker, set_chunk(settings, resent, queued_at=utcnow() - timedelta(seconds=3)))
    emptied_at = utcnow() - timedelta(seconds=1)
    set_chunk(settings, later)  # queued after the emptying: its message may be on its way
    assert lost not in recover_chunks(settings)["redispatched"]  # the slow pass waits
    # Only this test's chunks are judged: earlier tests' chunks share the database.
    redispatched = set(recover_chunks(settings, emptied_at)["redispatched"])
    assert redispatched & {lost, resent, later} == {lost}
    assert get_chunk(settings, lost).task_id in waiting_ids(broker)


def test_beat_notices_an_emptied_redis_once_and_sends_the_reconciler(settings, broker):
    from core.queueing.broker import EPOCH_KEY
    from tasks.app import app
    from tasks.beat import EmptiedBrokerWatch

    watch = EmptiedBrokerWatch(app, broker)
    broker.delete(EPOCH_KEY)
    assert watch.check()
    sent = [json.loads(m)["headers"] for m in broker.lrange("maintenance", 0, -1)]
    assert [h["task"] for h in sent] == ["laneway.reconcile"]
    assert "emptied_at" in sent[0]["kwargsrepr"]
    assert not watch.check()  # marked: the next tick sends nothing
    broker.flushdb()  # Redis restarted without its data
    assert watch.check()
    # Redis away: no send, no crash, and the check is made again on the next tick.
    away = EmptiedBrokerWatch(app, redis.Redis(port=1, socket_connect_timeout=1))
    assert not away.check() and away.away


def test_a_message_delivered_long_ago_to_a_chunk_never_started_counts_as_lost(
    settings, migrated, broker
):
    _, (chunk_id,) = make_job(settings)
    task_id = set_chunk(settings, chunk_id, queued_at=utcnow() - LONG_AGO)
    limit = settings.chunk_timeout_for("cpu")
    deliver_message(broker, task_id, delivered_ago=limit + 120)  # its holder died unstarted
    assert chunk_id in recover_chunks(settings)["redispatched"]


def test_a_running_chunk_whose_worker_stopped_beating_is_sent_again(settings, migrated, broker):
    _, (dead_chunk,) = make_job(settings)
    _, (live_chunk,) = make_job(settings)
    dead = live_worker(settings, seen_ago=settings.worker_dead_after + 5)
    alive = live_worker(settings)
    for chunk_id, instance in ((dead_chunk, dead), (live_chunk, alive)):
        task_id = set_chunk(
            settings,
            chunk_id,
            state="running",
            attempts=1,
            worker_instance=instance,
            started_at=utcnow(),
        )
        deliver_message(broker, task_id)  # the message stays unacked with its holder
    sent = recover_chunks(settings)["redispatched"]
    assert dead_chunk in sent and live_chunk not in sent
    assert get_chunk(settings, dead_chunk).last_error == "its worker stopped beating"
    assert get_chunk(settings, live_chunk).state == "running"
    assert dead in mark_dead_workers(settings)
    with session_scope(settings) as session:
        assert session.get(Worker, dead).stop_reason == "heartbeat lost"
        assert session.get(Worker, alive).stopped_at is None


def test_a_worker_given_up_on_that_beats_again_is_alive_again(settings, migrated):
    """A host whose link came back: its worker is trusted again, so the chunks it takes
    from now on are not sent a second time as a dead worker's."""
    from db.models import WorkerEvent
    from tasks.maintenance import live_workers
    from workers.registry import beat, stopped

    silent = live_worker(settings, seen_ago=settings.worker_dead_after + 5)
    assert silent in mark_dead_workers(settings) and silent not in live_workers(settings)
    beat(silent)
    assert silent in live_workers(settings)
    with session_scope(settings) as session:
        assert session.get(Worker, silent).stop_reason is None
        events = session.scalars(select(WorkerEvent.kind).where(WorkerEvent.worker_id == silent))
        assert list(events) == ["revived"]
    # A worker that announced its stop stays stopped, whatever beats late.
    gone = live_worker(settings)
    stopped(gone, "warm shutdown")
    beat(gone)
    assert gone not in live_workers(settings)


def test_a_running_chunk_past_its_time_limit_without_a_message_is_sent_again(
    settings, migrated, broker
):
    alive = live_worker(settings)
    _, (ended,) = make_job(settings)
    _, (requeued,) = make_job(settings)
    past = utcnow() - timedelta(seconds=settings.chunk_timeout_for("cpu") + 60)
    for chunk_id in (ended, requeued):
        set_chunk(settings, chunk_id, state="running", worker_instance=alive, started_at=past)
    # The second chunk's message went back to the queue (its child process died).
    push_message(broker, get_chunk(settings, requeued).task_id)
    sent = recover_chunks(settings)["redispatched"]
    assert ended in sent and requeued not in sent
    assert get_chunk(settings, ended).last_error == "it outlived its time limit"


def test_a_chunk_that_keeps_killing_its_workers_is_split_down_to_the_item(
    settings, migrated, broker
):
    job_id, (chunk_id,) = make_job(settings, n_items=2, chunk_size=2)
    limit = attempt_limit(settings)
    set_chunk(settings, chunk_id, state="running", attempts=limit, started_at=utcnow())
    assert chunk_id in recover_chunks(settings)["split"]
    with session_scope(settings) as session:
        halves = session.scalars(select(Chunk).where(Chunk.parent_id == chunk_id)).all()
        assert session.get(Chunk, chunk_id).state == "split"
        assert sorted((c.start, c.stop, c.state, c.attempts) for c in halves) == [
            (0, 1, "queued", 0),
            (1, 2, "queued", 0),
        ]
        half_ids = [c.id for c in halves]
        task_ids = {c.task_id for c in halves}
    assert task_ids <= waiting_ids(broker)
    # One half dies too often as well: alone, its item fails with a dead letter.
    set_chunk(settings, half_ids[0], state="running", attempts=limit, started_at=utcnow())
    set_chunk(settings, half_ids[1], state="done")
    assert half_ids[0] in recover_chunks(settings)["split"]
    with session_scope(settings) as session:
        assert session.get(Chunk, half_ids[0]).state == "failed"
        letter = session.scalars(select(DeadLetter).where(DeadLetter.job_id == job_id)).one()
        assert letter.kind == "item" and letter.attempts == limit
        result = session.scalars(select(Result).where(Result.job_id == job_id)).one()
        assert "its worker stopped beating" in result.error
        # The job settled as the last chunk ended: one item failed, one has no result.
        assert session.get(Job, job_id).status == "failed"


def test_a_cancelled_jobs_stalled_chunk_is_cancelled_not_sent(settings, migrated, broker):
    job_id, (running, queued) = make_job(settings, n_items=4, chunk_size=2)
    set_chunk(settings, running, state="running", started_at=utcnow())  # no live worker
    assert cancel_job(job_id, settings) == "cancelling"
    assert get_chunk(settings, queued).state == "cancelled"
    assert running in recover_chunks(settings)["cancelled"]
    with session_scope(settings) as session:
        job = session.get(Job, job_id)
        assert (job.status, job.cancelled_items, job.failed_items) == ("cancelled", 4, 0)
    assert not {get_chunk(settings, c).task_id for c in (running, queued)} & waiting_ids(broker)


def test_orphaned_jobs_are_finalized_once(settings, migrated, broker):
    job_id, (chunk_id,) = make_job(settings)
    set_chunk(settings, chunk_id, state="done")
    first = [finalize_orphaned_jobs(settings) for _ in range(2)]
    assert str(job_id) in first[0] and str(job_id) not in first[1]
    with session_scope(settings) as session:
        events = session.scalars(
            select(JobEvent.kind).where(JobEvent.job_id == job_id, JobEvent.kind == "finalized")
        ).all()
        assert events == ["finalized"]
        assert session.get(Job, job_id).status == "failed"  # no item has a result


def test_two_reconcilers_at_once_send_each_lost_chunk_once(settings, migrated, broker):
    chunk_ids = []
    for _ in range(6):
        _, (chunk_id,) = make_job(settings)
        set_chunk(settings, chunk_id, queued_at=utcnow() - LONG_AGO)
        chunk_ids.append(chunk_id)
    outcomes: list[list[int]] = []
    barrier = threading.Barrier(2)

    def run() -> None:
        barrier.wait()
        outcomes.append(recover_chunks(settings)["redispatched"])

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sent = outcomes[0] + outcomes[1]
    assert len(sent) == len(set(sent))  # no chunk sent by both
    assert set(chunk_ids) <= set(sent)
    assert broker.llen("cpu") == len(sent)


CLOSED_BROKER = {"redis": "redis://127.0.0.1:1/0", "rabbitmq": "amqp://guest:guest@127.0.0.1:1//"}


def check_an_unsent_chunk_is_sent_again_at_once(settings) -> None:
    """A send that fails after its commit (the broker away) notes its chunk; the next pass
    sends it again without waiting out the grace, once. Shared by the Redis test here and
    the RabbitMQ one (tests/integration/test_rabbitmq.py)."""
    import kombu.exceptions

    from core.queueing.broker import depth
    from core.queueing.celery_app import make_celery
    from core.queueing.dispatch import send_chunks, unsent_chunks

    _, (chunk_id, other) = make_job(settings, n_items=4)
    broker = "rabbitmq" if settings.broker_is_rabbitmq else "redis"
    make_celery(
        settings.replace(broker_url=CLOSED_BROKER[broker])
    )  # what this process sends through
    with pytest.raises(kombu.exceptions.OperationalError):
        send_chunks([(get_chunk(settings, chunk_id), "cpu")])
    assert unsent_chunks(settings) == {chunk_id}
    make_celery(settings)  # the broker is back
    assert recover_chunks(settings)["redispatched"] == [chunk_id]  # queued just now: no grace
    assert get_chunk(settings, chunk_id).last_error == "its send failed (the broker was away)"
    assert get_chunk(settings, other).last_error is None  # queued as recently, not noted
    assert unsent_chunks(settings) == set()
    assert depth(settings, "cpu")["queued"] == 1
    assert recover_chunks(settings)["redispatched"] == []  # its message waits now


def test_a_chunk_whose_send_failed_is_sent_again_at_once(settings, migrated, broker):
    check_an_unsent_chunk_is_sent_again_at_once(settings)
