"""Two beats at once, their reconcilers running side by side on a maintenance worker with
two processes, while a worker is killed mid-chunk: the stalled chunk is sent again once,
each item has exactly one result, and the job is finalized once."""

from __future__ import annotations

import os
import signal

import pytest

from core.util.faults import stall_file
from tests.e2e.procs import BIN, start_worker
from tests.faults.harness import (
    FAST,
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


def test_two_beats_recover_a_killed_worker_once(settings, migrated, account_factory, tmp_path):
    account, _ = account_factory("trial")
    job_id = submit_held(settings, account, 64)  # 4 chunks of 16, the first held
    # Each beat keeps its own schedule file under its own LANEWAY_HOME.
    beats = [
        beat(tmp_path, f"beat{i}", {**QUICK_DEATH, "LANEWAY_HOME": str(tmp_path / f"b{i}")})
        for i in (1, 2)
    ]
    maintenance = start_worker(
        "maintenance",
        [str(BIN / "laneway"), "worker", "maintenance", "-c", "2"],
        tmp_path,
        env={**FAST, **QUICK_DEATH},
        models=False,
    )
    victim = cpu_worker(tmp_path, "victim", env={**QUICK_DEATH, **HOLDS})

    killed_chunk = wait_held_chunk(settings, job_id, victim)
    os.killpg(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait()
    stall_file(settings).unlink()
    survivor = cpu_worker(tmp_path, "survivor", env=QUICK_DEATH)
    procs = [*beats, maintenance, survivor]
    try:
        status = wait_final(settings, job_id, RECOVERY_DEADLINE, procs)
    finally:
        for proc in reversed(procs):
            proc.stop()
    assert status == "succeeded"
    assert_exactly_one_result_each(settings, job_id, 64)
    assert len(events(settings, job_id, "finalized")) == 1
    resent = [e["chunk"] for e in events(settings, job_id, "chunk_redispatched")]
    assert resent == [killed_chunk]
    # Both beats sent reconcilers, and the maintenance worker ran them.
    assert all("Sending due task reconcile" in b.log.read_text() for b in beats)
    assert maintenance.log.read_text().count("laneway.reconcile") >= 4
    print("FIGURES second-beat: items=64 beats=2 lost=0")
