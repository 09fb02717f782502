"""The batch lanes on RabbitMQ (LANEWAY_BROKER_URL amqp://), against a real node, each test
on a vhost of its own: what Laneway declares (quorum queues with a delivery limit), what it
reads back (depths, the reconciler's view) and how tests empty it. Marked slow: making and
deleting a vhost runs rabbitmqctl."""

from __future__ import annotations

from datetime import timedelta

import pytest
from kombu import Connection

from core.queueing.broker import broker_snapshot, depth, depths
from core.queueing.celery_app import QUEUES, LanewayTask
from core.queueing.dispatch import send_chunks
from db.common import utcnow
from tasks.maintenance import recover_chunks
from tests.broker import empty_queues
from tests.integration.test_reconcile import (
    LONG_AGO,
    check_an_unsent_chunk_is_sent_again_at_once,
    get_chunk,
    make_job,
    set_chunk,
)
from tests.rabbit import on_rabbitmq

pytestmark = pytest.mark.slow


@pytest.fixture
def rabbit(settings, migrated, monkeypatch):
    with on_rabbitmq(settings, monkeypatch) as on:
        yield on


def test_a_sent_chunk_waits_in_a_quorum_queue_until_its_delivery_limit(rabbit):
    _, (chunk_id,) = make_job(rabbit)
    assert depth(rabbit, "cpu") == {"queued": 0, "delivered": 0, "depth": 0}  # not declared
    send_chunks([(get_chunk(rabbit, chunk_id), "cpu")])
    found = depths(rabbit, QUEUES)
    assert found["cpu"] == {"queued": 1, "delivered": 0, "depth": 1}
    assert sum(q["depth"] for q in found.values()) == 1
    # A consumer that dies with the message (reject, requeue) gives it back each time: a
    # classic queue would hand it out forever, the quorum queue drops it past its limit.
    deliveries = 0
    with Connection(rabbit.broker) as conn:
        channel = conn.channel()
        while (message := channel.basic_get("cpu", no_ack=False)) is not None:
            deliveries += 1
            channel.basic_reject(message.delivery_info["delivery_tag"], requeue=True)
            assert deliveries <= 3 * rabbit.broker_delivery_limit, "never dropped"
    assert deliveries == rabbit.broker_delivery_limit + 1
    assert depth(rabbit, "cpu")["depth"] == 0


def test_the_reconciler_resends_a_lost_message_once_its_queue_holds_none(rabbit):
    """A chunk counts as lost only when its queue holds no ready message, past the grace
    plus the longest countdown; its new message then keeps it from being sent again."""
    _, (lost,) = make_job(rabbit)
    _, (waiting,) = make_job(rabbit)
    _, (recent,) = make_job(rabbit)
    grace = timedelta(seconds=rabbit.redispatch_after + LanewayTask.retry_backoff_max)
    set_chunk(rabbit, lost, queued_at=utcnow() - LONG_AGO)
    set_chunk(rabbit, waiting, queued_at=utcnow() - LONG_AGO)
    set_chunk(rabbit, recent, queued_at=utcnow() - grace + timedelta(seconds=30))
    send_chunks([(get_chunk(rabbit, waiting), "cpu")])  # a message waits in cpu
    assert broker_snapshot(rabbit, QUEUES).busy == {"cpu"}
    assert not {lost, waiting, recent} & set(recover_chunks(rabbit)["redispatched"])

    empty_queues(rabbit)  # the queue drains: nothing waiting could be the lost one's
    redispatched = set(recover_chunks(rabbit)["redispatched"])
    assert redispatched & {lost, waiting, recent} == {lost, waiting}
    assert get_chunk(rabbit, lost).last_error == "its broker message was lost"
    assert depth(rabbit, "cpu")["queued"] == len(redispatched)
    set_chunk(rabbit, lost, queued_at=utcnow() - LONG_AGO)
    assert lost not in recover_chunks(rabbit)["redispatched"]  # its message waits now


def test_redis_coming_back_empty_sends_nothing_again_on_rabbitmq(rabbit):
    """Beat's emptied-Redis signal is about Redis's messages: RabbitMQ lost none."""
    _, (chunk_id,) = make_job(rabbit)
    set_chunk(rabbit, chunk_id, queued_at=utcnow() - timedelta(seconds=3))
    emptied_at = utcnow() - timedelta(seconds=1)
    assert chunk_id not in recover_chunks(rabbit, emptied_at)["redispatched"]


def test_gpu_work_waiting_on_rabbitmq_is_what_scaling_reads(rabbit):
    from db.session import session_scope
    from fleet.processes import gpu_depth_reader
    from jobs.lanes import live_lanes

    gpu_depth = gpu_depth_reader(rabbit)
    assert gpu_depth() == 0
    _, (chunk_id,) = make_job(rabbit)
    # The gpu lane's model stage waits to run.
    set_chunk(rabbit, chunk_id, stage="model", queue="gpu")
    chunk = get_chunk(rabbit, chunk_id)
    send_chunks([(chunk, "gpu")])
    assert gpu_depth() == 1  # beat's scale-from-zero starts a gpu worker on this
    with session_scope(rabbit) as session:
        lanes = live_lanes(rabbit, session)  # routing reads the work not done, in Postgres
    assert (lanes.gpu_backlog_items, lanes.cpu_backlog_items) == (chunk.stop - chunk.start, 0)


def test_a_chunk_whose_send_failed_is_sent_again_at_once_on_rabbitmq(rabbit):
    """A RabbitMQ outage's failed sends go out on the first pass after it, not after the
    grace plus the longest countdown that a lost message waits out."""
    check_an_unsent_chunk_is_sent_again_at_once(rabbit)
