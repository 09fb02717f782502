"""RabbitMQ, the batch lanes' broker, stops for 8 s mid-job and starts again (the whole
node stopped and started on its data, as a service restart does): workers and beat lose their
connections and reconnect, and the job completes, each item with exactly one result.

Unlike Redis without persistence, RabbitMQ comes back with its messages: the lanes' queues
are durable quorum queues and every send waited for the broker's confirm. The node is
the test's own (tests/rabbit.py `private_node`): stopping it touches no other run's broker,
so the test runs beside the others."""

from __future__ import annotations

import time

import pytest

from tests.e2e.procs import wait_for
from tests.faults.harness import (
    RECOVERY_DEADLINE,
    assert_recovered,
    beat,
    cpu_worker,
    events,
    submit,
    wait_final,
    wait_under_way,
)
from tests.rabbit import on_broker, private_node

pytestmark = pytest.mark.e2e
OUTAGE = 8  # seconds, as for Redis (tests/faults/test_redis_restarted.py)


def connections(proc) -> int:
    return proc.log.read_text().count("Connected to amqp://")


def test_rabbitmq_restarted_mid_job_loses_nothing(
    settings, migrated, account_factory, tmp_path, monkeypatch
):
    account, _ = account_factory("trial")
    n = 160
    with private_node(tmp_path) as node:
        rabbit = on_broker(node.url, settings, monkeypatch)
        job_id = submit(rabbit, account, n)
        procs = [beat(tmp_path, "beat-rabbit"), cpu_worker(tmp_path, "cpu-rabbit")]
        worker = procs[1]
        try:
            wait_under_way(rabbit, job_id, procs, queued=3)
            before = connections(worker)
            node.stop()
            try:
                time.sleep(OUTAGE)  # the outage itself (the fault, not a wait)
            finally:
                node.start()
            back = time.monotonic()
            wait_for(lambda: connections(worker) > before, 60, "the worker to reconnect",
                     procs)  # fmt: skip
            reconnect = time.monotonic()
            status = wait_final(rabbit, job_id, RECOVERY_DEADLINE, procs)
            done = time.monotonic()
        finally:
            for proc in reversed(procs):
                proc.stop()
    assert_recovered(rabbit, job_id, n, status)
    resent = events(rabbit, job_id, "chunk_redispatched")
    print(
        f"FIGURES rabbitmq restarted: items={n} outage={OUTAGE}s "
        f"reconnected_in={reconnect - back:.1f}s done_in={done - back:.1f}s resent={len(resent)}"
    )
