"""Pure planning: which lane a job runs on, and how it is cut into chunks.

The lane is chosen from measured costs when there are measurements: each lane's expected
cost and completion time for the job, the gpu lane's cold start included when no gpu
worker is up (and the idle time it then runs before it is stopped again, by beat or by an
outside autoscaler). A job goes to
the gpu lane when that is cheaper and still meets its account's deadline. Until both lanes
have been measured, LANEWAY_GPU_THRESHOLD decides.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from core.config.settings import Settings
from core.vocab import ACCOUNT_TYPES

# Demo and trial traffic is small and interactive: it never waits for a GPU to start.
CPU_ONLY_ACCOUNTS = frozenset({"demo", "trial"})


@dataclass(frozen=True)
class LaneStats:
    """What the fleet measured on recent chunks (jobs/lanes.py computes it).

    Rates are per worker: a cpu worker runs all three stages of a cpu chunk; a gpu worker
    runs only the model stage of a gpu chunk, its pre- and post-processing running on cpu
    workers beside it.
    """

    cpu_items_per_second: float
    cpu_seconds_per_item: float
    gpu_items_per_second: float
    gpu_model_seconds_per_item: float
    gpu_cpu_seconds_per_item: float
    gpu_device: str  # where the gpu lane's model stage ran: "cuda", or "cpu" (fallback)
    cold_start_seconds: float | None
    # The cores a cpu worker held (its seconds are priced per core, core/util/pricing.py):
    # one worker of two threads and two of one run the same work at the same cost.
    cpu_cores: float = 1.0


@dataclass(frozen=True)
class LiveLanes:
    """The lanes now: workers up, devices the fleet can start, work already waiting."""

    cpu_workers: int
    gpu_workers_up: int
    gpu_devices: int | None  # None: unknown (no fleet supervisor reports its devices)
    cpu_backlog_items: int = 0
    gpu_backlog_items: int = 0

    def serving(self, lane: str) -> int:
        """The workers a job on `lane` runs on: the cpu workers (at least one); the gpu
        workers up, or when none is, the devices the fleet starts them on (at least one)."""
        if lane != "gpu":
            return max(1, self.cpu_workers)
        if self.gpu_workers_up == 0:
            return max(1, self.gpu_devices or 1)
        return self.gpu_workers_up


@dataclass(frozen=True)
class Prices:
    cpu_second: float
    gpu_second: float
    gpu_idle_timeout: int  # seconds a started gpu worker idles before it is stopped

    @classmethod
    def of(cls, settings: Settings) -> Prices:
        """LANEWAY_GPU_IDLE_TIMEOUT is charged whoever stops idle gpu workers (beat, or
        KEDA after its cooldownPeriod: LANEWAY_GPU_SCALE_DOWN=external)."""
        return cls(settings.cpu_price, settings.gpu_price, settings.gpu_idle_timeout)


@dataclass(frozen=True)
class Routing:
    lane: str
    policy: str  # "account", "threshold" or "measured"
    reason: str
    inputs: dict[str, Any]
    estimates: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check(account_type: str, n_items: int) -> None:
    if account_type not in ACCOUNT_TYPES:
        raise ValueError(f"unknown account type {account_type!r}")
    if n_items < 0:
        raise ValueError("n_items must not be negative")


def choose_lane(account_type: str, n_items: int, gpu_threshold: int) -> str:
    """The threshold rule: `gpu` for a standard or enterprise job above it, else `cpu`."""
    _check(account_type, n_items)
    if account_type in CPU_ONLY_ACCOUNTS:
        return "cpu"
    return "gpu" if n_items > gpu_threshold else "cpu"


def estimate(
    n_items: int, stats: LaneStats, live: LiveLanes, prices: Prices
) -> dict[str, dict[str, float]]:
    """Expected seconds to completion and dollars for the job on each lane."""
    cpu_workers = live.serving("cpu")
    cpu_seconds = (live.cpu_backlog_items + n_items) / (stats.cpu_items_per_second * cpu_workers)
    cpu_cost = n_items * stats.cpu_seconds_per_item * prices.cpu_second * stats.cpu_cores

    devices = max(1, live.gpu_devices or 1)
    cold = live.gpu_workers_up == 0
    cold_start = (stats.cold_start_seconds or 0.0) if cold else 0.0
    workers = live.serving("gpu")
    gpu_seconds = cold_start + (live.gpu_backlog_items + n_items) / (
        stats.gpu_items_per_second * workers
    )
    device_price = prices.gpu_second if stats.gpu_device == "cuda" else prices.cpu_second
    gpu_cost = n_items * (
        stats.gpu_model_seconds_per_item * device_price
        + stats.gpu_cpu_seconds_per_item * prices.cpu_second
    )
    # Starting from zero, every device is paid while it starts and while it idles after.
    scale_up_cost = devices * (cold_start + prices.gpu_idle_timeout) * device_price if cold else 0
    return {
        "cpu": {"seconds": round(cpu_seconds, 3), "cost": round(cpu_cost, 8)},
        "gpu": {
            "seconds": round(gpu_seconds, 3),
            "cost": round(gpu_cost + scale_up_cost, 8),
            "scale_up_cost": round(scale_up_cost, 8),
            "cold_start_seconds": round(cold_start, 3),
        },
    }


def route(
    account_type: str,
    n_items: int,
    *,
    gpu_threshold: int,
    deadline: int | None,
    stats: LaneStats | None,
    live: LiveLanes,
    prices: Prices,
    pinned: bool = False,
) -> Routing:
    """The lane for a job, with the inputs and estimates it was chosen from. `pinned`: the
    threshold rule decides whatever was measured (LANEWAY_ROUTING=threshold)."""
    _check(account_type, n_items)
    inputs: dict[str, Any] = {
        "account_type": account_type,
        "items": n_items,
        "deadline_seconds": deadline,
        "live": asdict(live),
        "prices": asdict(prices),
        "stats": asdict(stats) if stats else None,
    }
    if account_type in CPU_ONLY_ACCOUNTS or deadline is None:
        return Routing("cpu", "account", f"{account_type} accounts stay on cpu", inputs, {})
    if live.gpu_devices == 0:
        return Routing("cpu", "account", "no gpu device in the fleet", inputs, {})
    if stats is None:
        lane = choose_lane(account_type, n_items, gpu_threshold)
        why = "LANEWAY_ROUTING=threshold" if pinned else "nothing measured yet"
        reason = f"{why}: {n_items} items {'>' if lane == 'gpu' else '<='} "
        return Routing(
            lane, "threshold", reason + f"LANEWAY_GPU_THRESHOLD={gpu_threshold}", inputs, {}
        )
    est = estimate(n_items, stats, live, prices)
    in_time = [lane for lane in ("cpu", "gpu") if est[lane]["seconds"] <= deadline]
    if in_time:
        lane = min(in_time, key=lambda x: (est[x]["cost"], x != "cpu"))
        other = "gpu" if lane == "cpu" else "cpu"
        why = (
            f"cheaper (${est[lane]['cost']:.6f} vs ${est[other]['cost']:.6f})"
            if other in in_time
            else f"the only lane within the {deadline} s deadline"
        )
    else:
        lane = min(("cpu", "gpu"), key=lambda x: est[x]["seconds"])
        why = f"neither lane meets the {deadline} s deadline: the faster one"
    return Routing(lane, "measured", why, inputs, est)


def chunk_size_for(
    n_items: int,
    *,
    floor: int,
    ceiling: int,
    target_seconds: float,
    items_per_second: float | None,
    workers: int,
) -> int:
    """Items per chunk for a job of `n_items` on a lane whose worker computes
    `items_per_second` (None: not measured yet).

    Each chunk costs the same fixed work around the model (its claim, finish and settling
    transactions, the refill of its slot, its messages): on a fast lane a chunk of `floor`
    items is over in milliseconds and that fixed work outweighs it. So a chunk holds about
    `target_seconds` of a worker's compute, as measured, within [floor, ceiling] items,
    and never so many that the job has fewer than two chunks per worker of its lane (each
    would otherwise idle while another ran the whole job). A slot then holds a worker for
    about `target_seconds` whatever the lane's speed, which is what fair share's turns and
    a cancel's wait are made of. Unmeasured, or `target_seconds` 0: `floor`.
    """
    if not items_per_second or items_per_second <= 0 or target_seconds <= 0:
        return floor
    size = min(
        math.ceil(items_per_second * target_seconds),
        ceiling,
        math.ceil(n_items / (2 * max(1, workers))),
    )
    return max(floor, size)


def plan_chunks(n_items: int, chunk_size: int) -> list[tuple[int, int]]:
    """Half-open item ranges [start, stop) of at most chunk_size items, covering 0..n_items."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    return [(start, min(start + chunk_size, n_items)) for start in range(0, n_items, chunk_size)]
