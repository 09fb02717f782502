from dataclasses import replace

import pytest

from jobs.planner import choose_lane, chunk_size_for, plan_chunks


@pytest.mark.parametrize("account_type", ["demo", "trial"])
@pytest.mark.parametrize("n", [1, 500, 501, 1_000_000])
def test_demo_and_trial_always_cpu(account_type, n):
    assert choose_lane(account_type, n, gpu_threshold=500) == "cpu"


@pytest.mark.parametrize("account_type", ["standard", "enterprise"])
def test_threshold_is_exclusive(account_type):
    assert choose_lane(account_type, 500, gpu_threshold=500) == "cpu"
    assert choose_lane(account_type, 501, gpu_threshold=500) == "gpu"
    assert choose_lane(account_type, 1, gpu_threshold=0) == "gpu"


def test_unknown_account_type_and_negative_counts_are_refused():
    with pytest.raises(ValueError, match="account type"):
        choose_lane("vip", 10, 500)
    with pytest.raises(ValueError):
        choose_lane("standard", -1, 500)


@pytest.mark.parametrize("n,size", [(0, 4), (1, 4), (4, 4), (5, 4), (1000, 256), (257, 256)])
def test_chunks_cover_every_item_once(n, size):
    chunks = plan_chunks(n, size)
    covered = [i for start, stop in chunks for i in range(start, stop)]
    assert covered == list(range(n))
    assert all(0 < stop - start <= size for start, stop in chunks)
    assert len(chunks) == -(-n // size)


def test_chunk_size_must_be_positive():
    with pytest.raises(ValueError):
        plan_chunks(10, 0)


def sized(n=100_000, *, speed, seconds=1.0, workers=1, floor=256, ceiling=2048) -> int:
    return chunk_size_for(
        n,
        floor=floor,
        ceiling=ceiling,
        target_seconds=seconds,
        items_per_second=speed,
        workers=workers,
    )


def test_a_chunk_holds_about_the_target_seconds_of_a_measured_worker():
    assert sized(speed=700.0) == 700  # 1 s at 700 items/s
    assert sized(speed=700.2, seconds=2.0) == 1401  # rounded up: never under the target
    assert sized(speed=400.0, seconds=0.5) == 256  # 200 would be under the floor


def test_unmeasured_or_switched_off_chunks_keep_the_floor():
    assert sized(speed=None) == 256
    assert sized(speed=0.0) == 256
    assert sized(speed=-5.0) == 256  # a nonsense measurement changes nothing
    assert sized(speed=5000.0, seconds=0.0) == 256  # LANEWAY_CHUNK_SECONDS=0


def test_a_fast_lane_is_held_to_the_ceiling():
    assert sized(speed=30_000.0) == 2048
    assert sized(speed=30_000.0, ceiling=8192) == 8192
    # A floor above the ceiling (an operator's LANEWAY_CHUNK_SIZE) wins: chunks never shrink.
    assert sized(speed=30_000.0, floor=4096, ceiling=2048) == 4096


def test_a_job_keeps_two_chunks_per_worker_of_its_lane():
    # 5,000 items on two workers: four chunks of 1,250, not three of 2,048 and one idle.
    assert sized(5_000, speed=30_000.0, workers=2) == 1250
    assert len(plan_chunks(5_000, 1250)) == 4
    assert sized(5_000, speed=30_000.0, workers=0) == 2048  # no worker up: counted as one
    # Never below the floor: a small job on many workers is as it was.
    assert sized(1_000, speed=30_000.0, workers=8) == 256


# --- routing from measured costs -------------------------------------------------------

from jobs.planner import LaneStats, LiveLanes, Prices, estimate, route  # noqa: E402

# A CPU worker at 140 items/s for all stages; a GPU worker at 4,000 items/s in the model
# stage with 0.1 ms of CPU pre/post per item; a 20 s cold start.
STATS = LaneStats(
    cpu_items_per_second=140.0,
    cpu_seconds_per_item=1 / 140,
    gpu_items_per_second=4000.0,
    gpu_model_seconds_per_item=1 / 4000,
    gpu_cpu_seconds_per_item=0.0001,
    gpu_device="cuda",
    cold_start_seconds=20.0,
)
PRICES = Prices(cpu_second=0.0002, gpu_second=0.0015, gpu_idle_timeout=300)
WARM = LiveLanes(cpu_workers=2, gpu_workers_up=1, gpu_devices=1)
COLD = LiveLanes(cpu_workers=2, gpu_workers_up=0, gpu_devices=1)


def decide(n, live=WARM, stats=STATS, deadline=900, account="standard"):
    return route(
        account,
        n,
        gpu_threshold=500,
        deadline=deadline,
        stats=stats,
        live=live,
        prices=PRICES,
    )


def test_without_measurements_the_threshold_decides_and_says_so():
    small, big = decide(100, stats=None), decide(10_000, stats=None)
    assert (small.lane, big.lane) == ("cpu", "gpu")
    assert small.policy == big.policy == "threshold"
    assert "LANEWAY_GPU_THRESHOLD=500" in big.reason and big.inputs["stats"] is None


def test_interactive_accounts_stay_on_cpu_whatever_the_cost():
    for account in ("demo", "trial"):
        routing = decide(1_000_000, account=account, deadline=None)
        assert (routing.lane, routing.policy) == ("cpu", "account")


def test_a_warm_gpu_is_cheaper_per_item_and_takes_the_job():
    routing = decide(10_000)
    assert (routing.lane, routing.policy) == ("gpu", "measured")
    est = routing.estimates
    assert est["gpu"]["cost"] < est["cpu"]["cost"] and est["gpu"]["scale_up_cost"] == 0
    assert "cheaper" in routing.reason
    assert routing.inputs["live"]["gpu_workers_up"] == 1  # the decision shows its inputs


def test_a_cold_start_makes_small_jobs_cheaper_on_cpu_and_big_ones_on_gpu():
    # From zero, a GPU is paid for its cold start and its idle tail (300 s) too.
    small = decide(2_000, live=COLD)
    assert small.lane == "cpu"
    assert small.estimates["gpu"]["scale_up_cost"] == pytest.approx((20 + 300) * 0.0015)
    assert small.estimates["gpu"]["seconds"] > 20  # the cold start is in the time too
    big = decide(1_000_000, live=COLD, deadline=8 * 3600)
    assert big.lane == "gpu"


def test_a_deadline_the_cpu_lane_cannot_meet_sends_the_job_to_the_gpu():
    # 20,000 items: ~71 s on two cpu workers, ~25 s on a gpu from zero; cpu is cheaper.
    relaxed = decide(20_000, live=COLD, deadline=3600)
    tight = decide(20_000, live=COLD, deadline=60)
    assert relaxed.lane == "cpu" and tight.lane == "gpu"
    assert "only lane within the 60 s deadline" in tight.reason


def test_when_no_lane_meets_the_deadline_the_faster_one_wins():
    routing = decide(1_000_000, live=COLD, deadline=10)
    assert routing.lane == "gpu" and "neither lane meets" in routing.reason


def test_a_fleet_without_gpu_devices_routes_to_cpu():
    none = LiveLanes(cpu_workers=1, gpu_workers_up=0, gpu_devices=0)
    assert decide(1_000_000, live=none).lane == "cpu"


def test_a_gpu_lane_running_on_cpu_fallback_is_priced_at_the_cpu_price():
    fallback = LaneStats(**{**STATS.__dict__, "gpu_device": "cpu", "cold_start_seconds": None})
    est = estimate(1000, fallback, WARM, PRICES)
    per_item = 1 / 4000 * PRICES.cpu_second + 0.0001 * PRICES.cpu_second
    assert est["gpu"]["cost"] == pytest.approx(1000 * per_item, rel=1e-3)


def test_backlog_counts_toward_completion_time():
    busy = LiveLanes(cpu_workers=2, gpu_workers_up=1, gpu_devices=1, cpu_backlog_items=28_000)
    assert estimate(1000, STATS, busy, PRICES)["cpu"]["seconds"] == pytest.approx(
        29_000 / 280, abs=0.01
    )


def test_a_cold_gpu_lane_is_charged_the_idle_time_whoever_stops_it():
    from core.config.settings import Settings

    # Starting from zero pays each device's cold start and the idle time before it is
    # stopped: beat's timeout, or KEDA's cooldownPeriod when KEDA stops the pods.
    cold = LiveLanes(cpu_workers=2, gpu_workers_up=0, gpu_devices=4)
    for env in ({}, {"LANEWAY_GPU_SCALE_DOWN": "external"}):
        prices = Prices.of(Settings.from_env({**env, "LANEWAY_GPU_IDLE_TIMEOUT": "300"}))
        gpu = estimate(10_000, STATS, cold, prices)["gpu"]
        assert gpu["scale_up_cost"] == pytest.approx(4 * (20 + 300) * 0.0015)
    # An idle time of 0 charges only the cold starts: what KEDA-scaled fleets were
    # charged when LANEWAY_GPU_IDLE_TIMEOUT=0 was how beat was told to leave them alone.
    free = estimate(
        10_000, STATS, cold, Prices.of(Settings.from_env({"LANEWAY_GPU_IDLE_TIMEOUT": "0"}))
    )
    assert free["gpu"]["scale_up_cost"] == pytest.approx(4 * 20 * 0.0015)


def test_a_cpu_lane_of_workers_sharing_hosts_costs_their_share():
    """Two one-thread workers on a host's two cores each run half as fast as one worker of
    both: per worker the seconds per item double, each second holds half the cores, the
    cost stays."""
    both = replace(STATS, cpu_cores=2)
    whole = estimate(1000, both, WARM, PRICES)["cpu"]["cost"]
    assert whole == pytest.approx(2 * estimate(1000, STATS, WARM, PRICES)["cpu"]["cost"])
    halves = replace(STATS, cpu_items_per_second=70.0, cpu_seconds_per_item=1 / 70, cpu_cores=1)
    assert estimate(1000, halves, WARM, PRICES)["cpu"]["cost"] == pytest.approx(whole)
