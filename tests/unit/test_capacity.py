"""The capacity plan's arithmetic (fleet/capacity.py), on a profile with round figures so
that each expected count is computed by hand beside it."""

from __future__ import annotations

import math

import pytest

from fleet.capacity import (
    HEADROOM,
    PROFILE_VERSION,
    PlanError,
    Pools,
    Prices,
    Profile,
    Target,
    plan,
    processes,
    profile_from_dict,
    profile_to_dict,
)
from fleet.capacity_check import predict_batch_rate, predict_closed_loop
from fleet.mmc import erlang_c, wait_quantile_s

POOLS = Pools(postgres_pool=5, postgres_overflow=5, web_threads=32, interactive_threads=32,
              batch_max=64, batch_wait_ms=50.0)  # fmt: skip
PRICES = Prices(cpu=0.0002, gpu=0.0015)


# Round figures: each expected count below is computed by hand from them.
PROFILE = {
    "version": PROFILE_VERSION,
    "machine": {"cpu": "Test CPU", "cores": 2, "device": "cpu", "measured_at": "then"},
    "model": "minilm",
    "worker_cores": 2,
    "batch": {"classify": {
        "model_cpu_s": 0.004, "worker_cpu_s": 0.001, "web_cpu_s": 0.0002,
        "postgres_cpu_s": 0.0005, "redis_cpu_s": 0.0001, "postgres_bytes": 2000,
        "postgres_rows": 2,
    }},
    "interactive": {"classify": {
        "levels": [
            {"clients": 1, "batch": 1, "web_cpu_s": 0.002, "worker_cpu_s": 0.02,
             "redis_cpu_s": 0.0005, "client_cpu_s": 0.0},
            {"clients": 64, "batch": 16, "web_cpu_s": 0.002, "worker_cpu_s": 0.005,
             "redis_cpu_s": 0.0005, "client_cpu_s": 0.0},
        ],
        "p50_ms_alone": 20, "p99_ms_alone": 30, "busy_share": 1.0,
    }},
}  # fmt: skip


def profile(**devices: dict) -> Profile:
    return profile_from_dict({**PROFILE, "devices": devices})


def test_processes_round_up_at_the_headroom() -> None:
    # 2.8 cores at 70 % of 2-core processes: 2.8 / 1.4 = 2 exactly, not 3
    assert processes(2.8, 2) == 2
    assert processes(2.81, 2) == 3
    assert processes(0.01, 2) == 1
    assert processes(0, 2) == 0


def test_a_cpu_batch_plan_by_hand() -> None:
    # 360,000 items/hour = 100 items/s; model + worker 5 ms an item = 0.5 cores busy,
    # 2-core processes at 70 %: ceil(0.5 / 1.4) = 1. Web 0.02 cores: one process.
    result = plan(Target(batch={("cpu", "classify"): 360_000}), profile(), PRICES, POOLS)
    rows = {r["process"]: r for r in result["processes"]}
    assert rows["cpu worker"]["count"] == 1
    assert rows["cpu worker"]["busy_cores"] == pytest.approx(0.5)
    assert rows["web"]["count"] == 1
    pg = result["postgres"]
    assert pg["busy_cores"] == pytest.approx(0.05)
    assert pg["cores"] == 1
    assert pg["connections_steady"] == 2 * 5 and pg["connections_max"] == 2 * 10
    assert pg["rows_per_s"] == pytest.approx(200)
    assert pg["write_mb_per_s"] == pytest.approx(0.2)
    assert pg["disk_gb_per_day"] == pytest.approx(17.3, abs=0.05)
    assert result["redis"]["busy_cores"] == pytest.approx(0.01)
    # cost: worker 2 cores + web 1 + Postgres 1 + Redis 1 = 5 cores x $0.0002 x 3600
    assert result["cost"]["per_hour"] == pytest.approx(5 * 0.0002 * 3600)
    assert result["cost"]["per_item"] == pytest.approx(5 * 0.0002 * 3600 / 360_000)
    assert result["interactive"] is None


def test_a_large_cpu_plan_scales_the_workers() -> None:
    # 500,000/hour = 138.9 items/s x 5 ms = 0.694 cores: 1 worker; x 20: 13.9 cores -> 10
    small = plan(Target(batch={("cpu", "classify"): 500_000}), profile(), PRICES, POOLS)
    big = plan(Target(batch={("cpu", "classify"): 10_000_000}), profile(), PRICES, POOLS)
    count = {r["process"]: r["count"] for r in big["processes"]}
    assert [r["count"] for r in small["processes"] if r["process"] == "cpu worker"] == [1]
    assert count["cpu worker"] == math.ceil(10_000_000 / 3600 * 0.005 / (2 * HEADROOM))
    assert count["cpu worker"] == 10


def test_the_gpu_lane_counts_devices_and_the_cpu_work_beside_them() -> None:
    # 3,600,000/hour = 1,000 items/s on GPUs of 500 items/s at 70 %: ceil(1000/350) = 3;
    # the worker's 1 ms an item stays on cpu workers: 1 core busy -> 1 process of 2
    target = Target(batch={("gpu", "classify"): 3_600_000}, device="cuda", device_rate=500)
    result = plan(target, profile(), PRICES, POOLS)
    rows = {r["process"]: r for r in result["processes"]}
    assert rows["gpu worker"]["gpus"] == 3
    assert rows["cpu worker"]["count"] == 1
    assert rows["cpu worker"]["busy_cores"] == pytest.approx(1.0)
    # the profile's own published figure serves when --device-rate is not given
    own = Target(batch={("gpu", "classify"): 3_600_000}, device="cuda")
    shown = plan(own, profile(cuda={"items_per_s": 500, "source": "a paper"}), PRICES, POOLS)
    assert shown["device_source"] == "a paper"
    assert [r["gpus"] for r in shown["processes"] if r["process"] == "gpu worker"] == [3]


def test_erlang_c_known_values() -> None:
    # One server: M/M/1 waits with probability rho.
    assert erlang_c(1, 0.5) == pytest.approx(0.5)
    # Two servers at 1 erlang: C = 1/3 (textbook: (a^2/2)/(1-a/2) over the sum).
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(2, 2.0) == 1.0
    assert erlang_c(3, 0.0) == 0.0
    assert 0 < erlang_c(2000, 1900) < 1  # stays finite for thousands of servers


def recursion(servers: int, load: float) -> float:
    """Erlang C by Erlang B's recursion alone, as erlang_c computes it below its shortcut."""
    b = 1.0
    for k in range(1, servers + 1):
        b = load * b / (k + load * b)
    return b / (1 - load / servers + load / servers * b)


@pytest.mark.parametrize("load", [700.0, 1000.0, 5000.0, 40_000.0])
def test_erlang_c_s_shortcut_is_what_the_recursion_gives(load: float) -> None:
    """Past a thousand servers and 12 standard deviations of spare, erlang_c answers 0 at
    once; the recursion agrees there, and just short of it erlang_c still runs it."""
    at = math.ceil(load + 12 * math.sqrt(load))
    at = max(at, 1001)
    assert erlang_c(at, load) == 0.0 and recursion(at, load) < 1e-28
    short = math.floor(load + 11 * math.sqrt(load))
    assert erlang_c(short, load) == pytest.approx(recursion(short, load), rel=1e-9)


def test_a_plan_for_a_vast_rate_is_made_at_once_not_by_a_step_per_server() -> None:
    """A hurried operator's 1e12 (or 1e300) requests/s: millions of servers, sized at once
    (the Erlang recursion's step per server ran for minutes)."""
    for rate in (1e12, 1e300):
        result = plan(Target(batch={}, interactive_rps=rate, p99_ms=500), profile(), PRICES, POOLS)
        shown = result["interactive"]
        assert shown["feasible"] and shown["utilization"] <= 0.7 and shown["p99_ms"] <= 500


def test_wait_quantile_of_mm1() -> None:
    # M/M/1, rate 5/s, service 0.1 s: P(W > t) = 0.5 exp(-5t); p99 at ln(50)/5
    assert wait_quantile_s(1, 5, 0.1) == pytest.approx(math.log(50) / 5)
    assert wait_quantile_s(1, 10, 0.1) == math.inf
    assert wait_quantile_s(10, 0.1, 0.1) == 0.0  # almost never waits


def test_cpu_per_request_is_linear_in_one_over_the_batch() -> None:
    cost = profile().interactive["classify"]
    assert cost.per_request("worker", 1) == pytest.approx(0.02)
    assert cost.per_request("worker", 16) == pytest.approx(0.005)
    assert cost.per_request("worker", 1000) == pytest.approx(0.005)  # flat past the last
    # at 4: 1/4 lies (1/4 - 1/16) / (1 - 1/16) = 0.2 of the way from batch 16 to 1
    assert cost.per_request("worker", 4) == pytest.approx(0.005 + 0.2 * 0.015)
    # batches grow as a power of the clients: 1 -> 1, 64 -> 16 is clients^(2/3)
    assert cost.batch_at(8) == pytest.approx(4.0)
    assert cost.batch_at(1) == pytest.approx(1.0)
    assert cost.batch_at(512) == pytest.approx(64.0)  # the same power past the last level


def test_interactive_plan_meets_the_p99_and_sizes_the_web() -> None:
    result = plan(Target(batch={}, interactive_rps=1000, p99_ms=500), profile(), PRICES, POOLS)
    inter = result["interactive"]
    # one process would get batches of 1000/s x 50 ms = 50 (past the largest measured, 16:
    # 5 ms), so 5 / 0.7 = 7.1 -> 8 cores, 4 processes; each then gets 250/s, batches of
    # 12.5: 1/12.5 lies 0.01867 of the way from 1/16 to 1, 5.28 ms -> 7.5 -> 8 cores again
    service = 0.005 + (1 / 12.5 - 1 / 16) / (1 - 1 / 16) * 0.015
    assert inter["feasible"] and inter["batch"] == 12.5
    assert inter["service_ms"] == pytest.approx(1000 * service, abs=1e-3)
    assert inter["servers"] == 8
    assert inter["p99_ms"] <= 500
    rows = {r["process"]: r["count"] for r in result["processes"]}
    assert rows["interactive worker"] == 4
    # web: 1000 x 2 ms = 2 cores at 70 % -> 3 processes
    assert rows["web"] == 3
    assert result["cost"]["per_request"] > 0 and result["cost"]["per_item"] is None


def test_a_p99_below_what_one_request_takes_is_infeasible() -> None:
    result = plan(Target(batch={}, interactive_rps=10, p99_ms=25), profile(), PRICES, POOLS)
    assert not result["interactive"]["feasible"]
    assert "infeasible" in result["interactive"]["reason"]
    assert "30 ms" in result["interactive"]["reason"]


def test_a_tight_p99_needs_more_servers_than_the_headroom_alone() -> None:
    loose = plan(Target(batch={}, interactive_rps=200, p99_ms=5000), profile(), PRICES, POOLS)
    tight = plan(Target(batch={}, interactive_rps=200, p99_ms=31), profile(), PRICES, POOLS)
    assert tight["interactive"]["servers"] > loose["interactive"]["servers"]
    assert tight["interactive"]["p99_ms"] <= 31


@pytest.mark.parametrize(
    ("target", "says"),
    [
        (Target(batch={}), "nothing to plan"),
        (Target(batch={("cpu", "classify"): -5}), "positive"),
        (Target(batch={("cpu", "classify"): 0}), "positive"),
        (Target(batch={("cpu", "classify"): math.nan}), "positive"),
        (Target(batch={("tpu", "classify"): 5}), "unknown lane 'tpu'"),
        (Target(batch={("cpu", "translate"): 5}), "unknown task 'translate'"),
        (Target(batch={("cpu", "embed"): 5}), "no batch figures for 'embed'"),
        (Target(batch={("gpu", "classify"): 5}), "--device cuda"),
        (Target(batch={("cpu", "classify"): 5}, device="tpu"), "unknown device 'tpu'"),
        (Target(batch={("cpu", "classify"): 5}, device="cuda"), "no GPU figure"),
        (Target(batch={("cpu", "classify"): 5}, device="cuda", device_rate=-1), "device rate"),
        (Target(batch={}, interactive_rps=-1), "positive"),
        (Target(batch={}, interactive_rps=5, p99_ms=0), "p99"),
        (Target(batch={}, interactive_rps=5, interactive_task="embed"), "no interactive"),
        (Target(batch={("cpu", "classify"): 5}, model="bert-large"), "not 'bert-large'"),
    ],
)
def test_bad_targets_are_one_clear_error(target: Target, says: str) -> None:
    with pytest.raises(PlanError, match=None) as caught:
        plan(target, profile(), PRICES, POOLS)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


def test_profile_round_trip_and_versions() -> None:
    data = profile_to_dict(profile())
    assert profile_from_dict(data) == profile()
    with pytest.raises(PlanError, match="version 0"):
        profile_from_dict({**data, "version": 0})
    with pytest.raises(PlanError, match="incomplete"):
        profile_from_dict({k: v for k, v in data.items() if k != "batch"})
    with pytest.raises(PlanError, match="not a JSON object"):
        profile_from_dict([])
    # A hand-edited cost per thread count that is not one: the same one-line refusal.
    for damaged in ({"two": 0.004}, [0.004], {"1": "fast"}, {"1": 0}, {"1": -0.004},
                    {"1": float("nan")}, {"0": 0.004}):  # fmt: skip
        batch = {"classify": PROFILE["batch"]["classify"] | {"model_cpu_s_at": damaged}}
        with pytest.raises(PlanError, match="incomplete"):
            profile_from_dict({**data, "batch": batch})
    # So is a cost that would divide by zero or predict nonsense.
    for field_, value in (("model_cpu_s", 0.0), ("worker_cpu_s", -1.0), ("redis_cpu_s", "x")):
        batch = {"classify": PROFILE["batch"]["classify"] | {field_: value}}
        with pytest.raises(PlanError, match="incomplete"):
            profile_from_dict({**data, "batch": batch})


def test_predictions_for_the_measured_machine() -> None:
    p = profile()
    # one worker of 2 threads on 2 cores: min(2 / 5 ms, 2 / 5.8 ms) = 344.8 items/s
    assert predict_batch_rate(p, "classify", 1, 2) == pytest.approx(2 / 0.0058)
    # one worker of 1 thread: bound by its core, 1 / 5 ms
    assert predict_batch_rate(p, "classify", 1, 1) == pytest.approx(200)
    # measured at one thread too (3 ms of model a core): two such workers on the 2 cores
    # are bound by the machine, 2 / (3 + 1 + 0.8 ms), one by its core, 1 / 4 ms
    at = PROFILE["batch"]["classify"] | {"model_cpu_s_at": {"1": 0.003, "2": 0.004}}
    one_thread = profile_from_dict({**PROFILE, "batch": {"classify": at}})
    assert predict_batch_rate(one_thread, "classify", 2, 1) == pytest.approx(2 / 0.0048)
    assert predict_batch_rate(one_thread, "classify", 1, 1) == pytest.approx(250)
    assert predict_batch_rate(one_thread, "classify", 1, 2) == pytest.approx(2 / 0.0058)
    assert profile_from_dict(profile_to_dict(one_thread)) == one_thread  # kept through JSON
    # one client: its own latency bounds it, 1000 / 20 ms = 50 requests/s, p99 as alone
    one = predict_closed_loop(p, "classify", 1)
    assert one["requests_per_s"] == pytest.approx(50)
    assert one["p99_ms"] == pytest.approx(30)
    # 64 clients: the cores bound it, 2 / (5 + 2 + 0.5 ms) = 266.7/s; Little: 64/266.7 s
    many = predict_closed_loop(p, "classify", 64)
    assert many["requests_per_s"] == pytest.approx(2 / 0.0075)
    assert many["p99_ms"] == pytest.approx(64 / (2 / 0.0075) * 1000 * 1.5)
    # 8 clients fill batches of 4: worker 8 ms, 2 / 10.5 ms = 190.5/s
    eight = predict_closed_loop(p, "classify", 8)
    assert eight["requests_per_s"] == pytest.approx(2 / 0.0105)


def test_the_p99_under_load_takes_the_tail_each_level_measured() -> None:
    """A request's p99 with many clients is the mean latency times the tail measured at
    that load, not the tail of a request alone: alone the p99 is the model's and the
    machine's outliers (here 3x the median), under load every request waits out batches
    and the p99 is nearer the mean (here 1.8x). A profile without the levels' tails keeps
    the tail alone at every load."""
    measured = PROFILE["interactive"]["classify"]["levels"]
    levels = [x | {"p99_over_mean": tail} for x, tail in zip(measured, (2.5, 1.8), strict=True)]
    inter = PROFILE["interactive"]["classify"] | {"levels": levels, "p99_ms_alone": 60}
    p = profile_from_dict({**PROFILE, "interactive": {"classify": inter}})
    assert profile_from_dict(profile_to_dict(p)) == p  # kept through JSON
    many = predict_closed_loop(p, "classify", 64)
    assert many["p99_ms"] == pytest.approx(64 / many["requests_per_s"] * 1000 * 1.8)
    # One client: its mean latency is the p99 alone over the tail alone, 60 / 2.5 = 24 ms
    # (its median 20): 1000 / 24 requests/s, and the p99 alone again.
    one = predict_closed_loop(p, "classify", 1)
    assert one["requests_per_s"] == pytest.approx(1000 / 24)
    assert one["p99_ms"] == pytest.approx(60)
    # 8 clients: half way from 1 to 64 in log clients, half way from 2.5 to 1.8
    eight = predict_closed_loop(p, "classify", 8)
    assert eight["p99_ms"] == pytest.approx(8 / eight["requests_per_s"] * 1000 * 2.15)
    # past the most clients measured: that level's tail
    more = predict_closed_loop(p, "classify", 512)
    assert more["p99_ms"] == pytest.approx(512 / more["requests_per_s"] * 1000 * 1.8)
    # without the levels' tails: the tail alone (60 / 20 ms) at 64 clients too, and one
    # client at the median alone
    alone = profile_from_dict({**PROFILE, "interactive": {"classify": inter | {
        "levels": PROFILE["interactive"]["classify"]["levels"]}}})  # fmt: skip
    assert predict_closed_loop(alone, "classify", 64)["p99_ms"] == pytest.approx(
        64 / many["requests_per_s"] * 1000 * 3.0
    )
    assert predict_closed_loop(alone, "classify", 1)["requests_per_s"] == pytest.approx(50)
    # A hand-edited tail that is not a positive number: the one-line refusal.
    for damaged in (0, -1.5, float("nan"), float("inf"), "wide", None, True):
        bad = [levels[0] | {"p99_over_mean": damaged}, levels[1]]
        with pytest.raises(PlanError, match="incomplete"):
            profile_from_dict({**PROFILE, "interactive": {"classify": inter | {"levels": bad}}})


def test_checks_compare_predictions_with_a_later_run() -> None:
    from fleet.capacity_check import checks

    p = profile()
    later = {
        "batch": {"classify": [{"workers": 1, "threads": 2, "items_per_s": 2 / 0.0058 * 1.1}]},
        "interactive": {"classify": [{"clients": 64, "requests_per_s": 2 / 0.0075 / 1.5,
                                      "p99_ms": 360.0}]},
    }  # fmt: skip
    rows = {r["check"]: r for r in checks(p, later)}
    batch = rows["batch classify, 1 worker(s) items/s"]
    assert batch["error"] == pytest.approx(1 / 1.1 - 1, abs=1e-3) and batch["within"]
    rps = rows["interactive classify, 64 clients requests/s"]
    assert rps["error"] == pytest.approx(0.5, abs=1e-3) and not rps["within"]
    assert rows["interactive classify, 64 clients p99 ms"]["within"]
    assert checks(p, {"batch": {"embed": [{"workers": 1, "threads": 2, "items_per_s": 1}]}}) == []
