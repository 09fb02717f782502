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
    assert_recovered,
    beat,
    cpu_worker,
    events,
    job_report,
    submit,
    wait_final,
    wait_under_way,
)

pytestmark = pytest.mark.e2e
# docs/reliability.md: once Redis answers again, empty, the lost chunks are sent again within
# this many seconds (beat notices within 2 s; one reconciler pass on the maintenance queue,
# which may first wait for a chunk the cpu worker is running).
PROMPT_RESEND = 15


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
    _, took = recover_from_flush(settings, job_id, n, procs)
    print(f"FIGURES flushdb {account_type}: items={n} recovered_in={took:.1f}s")


def test_lost_chunks_are_sent_again_promptly_after_redis_comes_back_empty(
    settings, migrated, account_factory, tmp_path
):
    """At the default reconcile interval (30 s: a lost chunk's grace is 80 s), beat sees the
    emptied Redis and the lost chunks go out again within PROMPT_RESEND seconds."""
    account, _ = account_factory("trial")
    n = 160  # 10 chunks of 16
    slow = {"LANEWAY_RECONCILE_INTERVAL": "30"}
    job_id = submit(settings, account, n)
    procs = [beat(tmp_path, "beat-prompt", env=slow)]
    procs.append(cpu_worker(tmp_path, "cpu-prompt", env=slow))
    resent, took = recover_from_flush(settings, job_id, n, procs, resend_within=PROMPT_RESEND)
    print(f"FIGURES flushdb prompt: items={n} resent_in={resent:.1f}s recovered_in={took:.1f}s")


def recover_from_flush(
    settings, job_id, n: int, procs, resend_within: float | None = None
) -> tuple[float | None, float]:
    """Empty Redis (FLUSHDB: the epoch key goes too) once the job is under way; stop the
    processes once it ends, and check every item has one result. Returns the seconds from
    the flush to the first re-send (checked against `resend_within`) and to the job's end."""
    resent = None
    try:
        wait_under_way(settings, job_id, procs)
        redis.Redis.from_url(settings.redis_url).flushdb()
        flushed = time.monotonic()
        if resend_within is not None:
            wait_for(lambda: events(settings, job_id, "chunk_redispatched"), resend_within,
                     "the lost chunks to be sent again", procs,
                     report=lambda: job_report(settings, job_id))  # fmt: skip
            resent = time.monotonic() - flushed
        status = wait_final(settings, job_id, RECOVERY_DEADLINE, procs)
        took = time.monotonic() - flushed
    finally:
        for proc in reversed(procs):
            proc.stop()
    assert_recovered(settings, job_id, n, status)
    reasons = {e["reason"] for e in events(settings, job_id, "chunk_redispatched")}
    assert reasons == {"its broker message was lost"}  # the lost messages were re-sent
    return resent, took
