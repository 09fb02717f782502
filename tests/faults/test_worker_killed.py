"""SIGKILL of a whole worker in the middle of a chunk: the job still completes, each item
with exactly one result (real workers, beat, Postgres and Redis), on either broker of the
batch lanes (Redis, or RabbitMQ on a vhost of the test's own)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from core.util.faults import stall_file
from tests.faults.harness import (
    HOLDS,
    QUICK_DEATH,
    RECOVERY_DEADLINE,
    assert_exactly_one_result_each,
    beat,
    cpu_worker,
    events,
    submit_held,
    wait_final,
    wait_held_chunk,
)

pytestmark = pytest.mark.e2e


def test_sigkill_mid_chunk_loses_nothing(lanes, migrated, account_factory, tmp_path):
    settings = lanes
    account, _ = account_factory("trial")
    job_id = submit_held(settings, account, 48)  # 3 chunks of 16, the first held
    victim = cpu_worker(tmp_path, "victim", env={**QUICK_DEATH, **HOLDS})

    killed_chunk = wait_held_chunk(settings, job_id, victim)
    os.killpg(victim.proc.pid, signal.SIGKILL)  # laneway, and with it its worker: no warm shutdown
    victim.proc.wait()
    stall_file(settings).unlink()  # (the survivor holds nothing: it runs without the fault)

    scheduler = beat(tmp_path, env=QUICK_DEATH)
    # The same node name, a new process.
    survivor = cpu_worker(tmp_path, "survivor", env=QUICK_DEATH)
    started = time.monotonic()
    try:
        status = wait_final(settings, job_id, RECOVERY_DEADLINE, [survivor, scheduler])
    finally:
        survivor.stop()
        scheduler.stop()
    took = time.monotonic() - started
    assert status == "succeeded", status
    assert took < RECOVERY_DEADLINE
    assert_exactly_one_result_each(settings, job_id, 48)
    assert len(events(settings, job_id, "finalized")) == 1
    resent = [e for e in events(settings, job_id, "chunk_redispatched")]
    if settings.broker_is_rabbitmq:
        # RabbitMQ gives the dead connection's unacknowledged message back at once: the
        # survivor may take it before the reconciler sees the worker dead (no resend), or
        # after (the one resend, whose twin message finds the chunk taken or done).
        assert [e["chunk"] for e in resent] in ([], [killed_chunk])
    else:
        # The dead worker's heartbeat stopped, so the reconciler sent its chunk again,
        # once, long before the broker's visibility timeout (120 s) would have.
        assert [e["chunk"] for e in resent] == [killed_chunk]
    assert all(e["reason"] == "its worker stopped beating" for e in resent)
    broker = "rabbitmq" if settings.broker_is_rabbitmq else "redis"
    print(f"FIGURES sigkill ({broker}): items=48 recovered_in={took:.1f}s resent={len(resent)}")
