"""`laneway calibrate` end to end at the least size it takes (100 items, 1 s per
interactive level, two levels): the real benchmarks (bench/throughput.py,
bench/controlplane.py and bench/latency.py, with their workers, web app and interactive
worker) against this run's Postgres and Redis, a profile written, and `laneway plan`
reading it. What it checks is that each figure is measured and read, not its precision."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleet.capacity import profile_from_dict
from fleet.cli import cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_calibrate_writes_a_profile_that_plan_reads(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "calibrate", "--items", "100", "--seconds", "1",
         "--levels", "1,4", "--profile", str(path)],
        capture_output=True, text=True, cwd=ROOT, timeout=900,
        # Every folder the benchmarks make (logs, reports) inside the test's own.
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    profile = profile_from_dict(json.loads(path.read_text()))
    batch, inter = profile.batch["classify"], profile.interactive["classify"]
    assert batch.model_cpu_s > 0 and batch.worker_cpu_s >= 0
    assert batch.postgres_cpu_s > 0  # this run's Postgres did the job's writes
    assert batch.postgres_rows >= 2  # an item row and a result row per item, at least
    assert inter.per_request("worker", 1) > 0 and inter.per_request("web", 1) > 0
    assert 1 <= inter.batch_at(4) <= 4 and 0 < inter.p50_ms_alone <= inter.p99_ms_alone
    assert 0 < inter.busy_share <= 1
    assert [x["clients"] for x in profile.measured["interactive"]["classify"]] == [1, 4]
    assert profile.machine["cores"] >= 1 and profile.machine["cpu"]
    assert list(tmp_path.glob("laneway-calibrate-*/latency.json"))  # its work stayed here

    shown = CliRunner().invoke(
        cli,
        [
            "plan",
            "--profile",
            str(path),
            "--json",
            "--batch",
            "cpu:classify=100000",
            "--interactive",
            "50",
        ],
    )
    assert shown.exit_code == 0, shown.output
    plan = json.loads(shown.output)
    assert {r["process"] for r in plan["processes"]} >= {"cpu worker", "web"}
    assert plan["cost"]["per_item"] > 0


def test_a_kill_mid_calibration_stops_the_benchmark_and_every_process_it_started(
    tmp_path: Path,
) -> None:
    """`laneway calibrate` started as a script's background job (SIGINT ignored, which its
    children inherit) gets a `kill` while the first benchmark's fleet runs: it exits, the
    benchmark interrupted (it wrote no report: it did not run on to its end) and every
    process the benchmark started gone with it."""
    import signal

    import psutil

    from tests.e2e.procs import wait_for

    def as_background_job() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    calibrate = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "calibrate", "--items", "100", "--seconds", "1",
         "--levels", "1", "--profile", str(tmp_path / "profile.json")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "TMPDIR": str(tmp_path)}, preexec_fn=as_background_job,
    )  # fmt: skip
    started: list[psutil.Process] = []

    def command(proc: psutil.Process) -> str:
        try:
            return " ".join(proc.cmdline())
        except psutil.Error:  # gone meanwhile
            return ""

    try:

        def fleet_running() -> bool:
            started[:] = psutil.Process(calibrate.pid).children(recursive=True)
            return any("celery" in command(p) for p in started)

        wait_for(fleet_running, 300, "the first benchmark's celery worker")
        calibrate.send_signal(signal.SIGTERM)
        output = calibrate.communicate(timeout=300)[0].decode(errors="replace")
        assert calibrate.returncode != 0, output[-2000:]
        assert not (tmp_path / "profile.json").exists()
        assert list(tmp_path.glob("laneway-calibrate-*/throughput.log"))  # it had begun
        assert not list(tmp_path.glob("laneway-calibrate-*/throughput.json")), output[-2000:]
        left = [command(p) for p in started if p.is_running()]
        assert [c for c in left if c] == []
    finally:
        calibrate.kill()  # a failed check leaves nothing running either
        for proc in started:
            try:
                proc.kill()
            except psutil.Error:
                pass
        calibrate.wait()
