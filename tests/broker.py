"""A quiet fleet between tests that start workers: earlier tests' jobs (no worker ran them)
are cancelled and their messages dropped, so they neither queue ahead of the work under
test nor come back through the reconciler, which re-sends queued chunks it finds without a
message; earlier fleets' reports of their gpu devices, which steer routing, are taken back."""

from __future__ import annotations

from collections.abc import Iterator

import amqp.exceptions
import redis
from kombu import Connection
from sqlalchemy import update

from core.queueing.broker import UNACKED, UNACKED_INDEX, queue_keys
from core.queueing.celery_app import QUEUES
from core.store.interactive_protocol import requests_key
from core.vocab import LANES
from db.common import UNSETTLED_CHUNK_STATES, utcnow
from db.models import FINAL_JOB_STATUSES, Chunk, Job
from db.session import session_scope
from jobs.lanes import FLEET_KEY


def empty_queues(settings, unacked: bool = False) -> None:
    """Drop every message waiting in the lanes' and maintenance queues and every
    interactive request waiting on its list (and, with unacked, the messages delivered to
    workers no longer running)."""
    r = redis.Redis.from_url(settings.redis_url)
    keys = [requests_key(lane) for lane in LANES]  # the interactive requests' lists
    if settings.broker_is_rabbitmq:
        # A dead worker's unacknowledged messages went back to their queue when its
        # connection dropped: purging the queues drops them too.
        purge_rabbitmq(settings.broker, QUEUES)
    else:
        keys += [key for queue in QUEUES for key in queue_keys(queue)]
        if unacked:
            keys += [UNACKED, UNACKED_INDEX]
    r.delete(*keys)


def purge_rabbitmq(url: str, queues) -> None:
    """Drop every ready message of `queues` (those never declared hold none)."""
    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        for queue in queues:
            try:
                channel.queue_purge(queue)
            except amqp.exceptions.NotFound:
                channel = conn.channel()


def quiesce(settings, unacked: bool = False) -> None:
    """Cancel every job still open in this run's database, then empty the queues. First
    the refills an earlier test's chunks asked for in this process (workers/refill.py runs
    them on a thread, a moment later) are waited for: one running after this would send
    the next test's chunks before the test does."""
    from workers.refill import drain

    drain()
    now = utcnow()
    with session_scope(settings) as session:
        session.execute(
            update(Chunk)
            .where(Chunk.state.in_(UNSETTLED_CHUNK_STATES))
            .values(state="cancelled", finished_at=now)
        )
        session.execute(
            update(Job)
            .where(Job.status.not_in(FINAL_JOB_STATUSES))
            .values(status="cancelled", cancel_requested_at=now, finished_at=now)
        )
    empty_queues(settings, unacked)
    # A fleet supervisor an earlier test killed (no warm stop, so no withdrawal) leaves its
    # report of gpu devices until it expires, and routing reads it: no such fleet lives on
    # into the next test.
    r = redis.Redis.from_url(settings.redis_url)
    stale = list(r.scan_iter(FLEET_KEY.format(host="*")))
    if stale:
        r.delete(*stale)


def quiet_fleet(settings, unacked: bool = False) -> Iterator[None]:
    """A test that starts workers: begin quiet, and leave no process of its own running
    (whatever failed before the test's own cleanup)."""
    from tests.e2e.procs import STARTED, stop_started_since

    quiesce(settings, unacked)
    started = len(STARTED)
    yield
    stop_started_since(started)
