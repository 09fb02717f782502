"""Redis emptied (FLUSHDB) in the middle of a job: queued messages, the chord's counter,
stage hand-offs and results are gone; Postgres still knows every chunk, and the job
completes with each item's result exactly once."""

from __future__ import annotations

import time

import pytest
import redis

from tests.e2e.procs import wait_for
from tests.faults.harness import (
    RECOVERY_DEADLINE,
    assert_exactly_one_result_each,
    beat,
    chunk_states,
    cpu_worker,
    events,
    job_report,
    submit,
    wait_final,
)

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("account_type", ["trial", "enterprise"])  # cpu lane, gpu lane
def test_flushdb_mid_job_loses_nothing(settings, migrated, account_factory, tmp_path, account_type):
    account, _ = account_factory(account_type)
    n = 96 if account_type == "trial" else 64  # 6 chunks on cpu, 4 gpu chunks (prep/model/post)
    job_id = submit(settings, account, n)
    procs = [beat(tmp_path)]
    procs.append(cpu_worker(tmp_path, f"cpu-{account_type}"))
    if account_type == "enterprise":
        from tests.e2e.procs import BIN, start_worker

        gpu = start_worker(
            "gpu0",
            [str(BIN / "laneway"), "worker", "gpu"],
            tmp_path,
            env={"LANEWAY_GPU_FALLBACK": "cpu", "LANEWAY_CHUNK_TIMEOUT": "30"},
            log_name=f"gpu-{account_type}",
        )
        procs.append(gpu)
    try:

        def some_done_some_waiting():
            states = chunk_states(settings, job_id)
            return states.count("done") >= 1 and states.count("queued") >= 2

        wait_for(
            some_done_some_waiting,
            120,
            "the job to be under way",
            procs,
            report=lambda: job_report(settings, job_id),
        )
        redis.Redis.from_url(settings.redis_url).flushdb()
        flushed = time.monotonic()
        status = wait_final(settings, job_id, RECOVERY_DEADLINE, procs)
        took = time.monotonic() - flushed
    finally:
        for proc in reversed(procs):
            proc.stop()
    assert status == "succeeded", status
    assert_exactly_one_result_each(settings, job_id, n)
    assert len(events(settings, job_id, "finalized")) == 1
    assert events(settings, job_id, "chunk_redispatched")  # the lost messages were re-sent
    print(f"FIGURES flushdb {account_type}: items={n} recovered_in={took:.1f}s")
