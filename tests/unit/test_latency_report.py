"""bench/latency.py's account of the tail: the slowest share of requests and their stages."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "latency.py"


@pytest.fixture
def latency(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    # The benchmark sets these for the servers it starts: undone after the test.
    for name in ("LANEWAY_CACHE_TTL", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(name, "kept")
    spec = importlib.util.spec_from_file_location("bench_latency", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_slowest_share_is_averaged_stage_by_stage(latency) -> None:  # noqa: ANN001
    latencies = [0.010] * 97 + [0.050, 0.060, 0.070]
    stages = [{"model": 5.0, "view": 8.0}] * 97 + [
        {"model": 30.0, "view": 40.0},
        {"model": 40.0, "view": 50.0},
        {"view": 65.0},  # no model stage (a cached answer, say): not counted as 0
    ]
    tail = latency.slowest_share(latencies, stages, 0.03)
    assert tail == {"share": 0.03, "total": 60.0, "model": 35.0, "view": 51.67}


def test_a_tiny_level_still_reports_its_slowest_request(latency) -> None:  # noqa: ANN001
    tail = latency.slowest_share([0.004, 0.020], [{"model": 1.0}, {"model": 9.0}], 0.03)
    assert tail == {"share": 0.03, "total": 20.0, "model": 9.0}
    assert latency.slowest_share([], [], 0.03) == {}
