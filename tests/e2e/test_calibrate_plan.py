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
