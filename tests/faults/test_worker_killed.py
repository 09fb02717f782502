"""SIGKILL of a whole worker in the middle of a chunk: the job still completes, each item
with exactly one result (real workers, beat, Postgres and Redis)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.faults.harness import (
    RECOVERY_DEADLINE,
    assert_exactly_one_result_each,
    beat,
    cpu_worker,
    events,
    submit,
    wait_final,
    wait_running_chunk,
)

pytestmark = pytest.mark.e2e


def test_sigkill_mid_chunk_loses_nothing(settings, migrated, account_factory, tmp_path):
    account, _ = account_factory("trial")
    job_id = submit(settings, account, 48)  # 3 chunks of 16
    victim = cpu_worker(tmp_path, "victim")

    killed_chunk = wait_running_chunk(settings, job_id, [victim])
    os.killpg(victim.proc.pid, signal.SIGKILL)  # parent and child: no warm shutdown
    victim.proc.wait()

    scheduler = beat(tmp_path)
    survivor = cpu_worker(tmp_path, "survivor")  # the same node name, a new process
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
    # The dead worker's heartbeat stopped, so the reconciler sent its chunk again, once,
    # long before the broker's visibility timeout (120 s) would have.
    resent = [e for e in events(settings, job_id, "chunk_redispatched")]
    assert [e["chunk"] for e in resent] == [killed_chunk]
    assert resent[0]["reason"] == "its worker stopped beating"
    print(f"FIGURES sigkill: items=48 recovered_in={took:.1f}s")
