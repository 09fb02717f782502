"""bench/calibrate.py: what each stage derives from its figures (its command line runs in
tests/integration/test_bench_scripts.py)."""

from __future__ import annotations

import importlib.util
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
