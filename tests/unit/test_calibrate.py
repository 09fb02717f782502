"""bench/calibrate.py: what each stage derives from its figures, and its command line."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "calibrate.py"


@pytest.fixture
def calibrate(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    # The script sets the workers' OpenMP variables and HF_HUB_OFFLINE: undone after the test.
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(name, "kept")
    spec = importlib.util.spec_from_file_location("bench_calibrate", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=300
    )


def test_half_rows_stop_at_the_first_count_where_fp16_weights_lose(calibrate) -> None:  # noqa: ANN001
    # Given out of order, with a late win past the first loss: the loss decides.
    speedups = {512: 1.1, 16: 2.0, 256: 0.7, 64: 1.3, 128: 1.2}
    assert calibrate.derive_half_rows(speedups) == 128
    assert calibrate.derive_half_rows({16: 0.9, 64: 1.5}) == 0
    assert calibrate.derive_half_rows({16: 1.0}) == 0  # even is no gain
    assert calibrate.derive_half_rows({16: 2.0, 2048: 1.01}) == 2048
    assert calibrate.derive_half_rows({}) == 0


def test_a_faster_precision_outside_the_tolerance_is_not_kept(calibrate) -> None:  # noqa: ANN001
    assert calibrate.derive_precision(2.7, True) == "auto"
    assert calibrate.derive_precision(2.7, False) == "fp32"
    assert calibrate.derive_precision(0.95, True) == "fp32"


def test_threads_and_the_tokenizer_pool_follow_most_batch_sizes(calibrate) -> None:  # noqa: ANN001
    assert calibrate.derive_model_threads([100, 150, 200], [120, 160, 190], cores=4) == 4
    assert calibrate.derive_model_threads([100, 150, 200], [120, 140, 190], cores=4) == 1
    assert calibrate.derive_model_threads([100, 150], [120, 140], cores=2) == 1  # a tie: one
    assert calibrate.derive_tokenizer_pool([10, 25, 33], [11, 22, 31]) is True
    assert calibrate.derive_tokenizer_pool([10, 20, 33], [11, 22, 31]) is False
    with pytest.raises(ValueError):
        calibrate.derive_model_threads([100, 150], [120], cores=2)


def test_the_advice_names_only_what_differs_from_the_shipped_default(calibrate) -> None:  # noqa: ANN001
    defaults = calibrate.shipped()
    assert defaults["HALF_ROWS"] == "512" and defaults["LANEWAY_PRECISION"] == "auto"
    lines = calibrate.advice({"HALF_ROWS": "128", "LANEWAY_PRECISION": "auto"}, defaults)
    assert lines == [
        "HALF_ROWS=128  (default 512: set it in inference/halfweights.py)",
        "LANEWAY_PRECISION=auto  (the default: nothing to set)",
    ]


def test_an_unknown_stage_or_no_rounds_is_refused_by_name() -> None:
    done = run("precision", "half_rows")
    assert done.returncode == 2 and "unknown stage half_rows" in done.stderr
    done = run("--rounds", "0", "half-rows")
    assert done.returncode == 2 and "at least 1, not 0" in done.stderr


def test_a_stage_runs_and_reports_what_it_derived() -> None:
    # half-rows times bare products (no model to load): the quickest real stage.
    done = run("half-rows", "--rounds", "2", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    if "HALF_ROWS" not in report["derived"]:
        pytest.skip(f"no fp16-weight products on this CPU: {report['half-rows']}")
    assert len(report["half-rows"]) == 8  # one line per row count
    assert int(report["derived"]["HALF_ROWS"]) in (0, 16, 64, 128, 256, 512, 768, 1024, 2048)
    assert any(line.startswith("HALF_ROWS=") for line in report["advice"])
