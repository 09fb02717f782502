"""The capacity plan's arithmetic, pure: from a profile measured on the user's machine
(`laneway calibrate`) and a target load, the processes, cores and devices, what Postgres and
Redis need, and the cost (`laneway plan`). A profile's figures are CPU seconds per item or
per request (robust to a shared or differently sized machine, unlike wall time): a tier's
cores are its rate times its cost, its processes those cores over one process's at most
HEADROOM busy; the interactive p99 is an M/M/c queue (Erlang C, fleet/mmc.py) over the
interactive workers' cores on top of the p99 with one client. docs/operations.md ("Capacity
planning") states each rule."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from core.vocab import LANES, TASKS
from fleet.mmc import wait_quantile_s

PROFILE_VERSION = 1
DEVICES = ("cpu", "cuda")
# No tier is planned to run busier than this: queues stay short, a process can fail or
# be recycled without overloading the rest, and a day's bursts have room.
HEADROOM = 0.7
# Postgres: what one backend holds beside shared memory (a connection's process, its
# catalog caches, work_mem for the fleet's small sorts), and the cache over the hot rows.
PG_BACKEND_MIB = 10
# Redis holds ids, hand-offs and rate-limit counters, never items: a floor covers it.
REDIS_MEMORY_GIB = 1.0


class PlanError(ValueError):
    """A target or a profile the plan cannot use; its message is the one line to print."""


# --- the profile -----------------------------------------------------------------------


@dataclass(frozen=True)
class BatchCost:
    """CPU seconds per item of one task's batch path, by tier, and what an item writes."""

    model_cpu_s: float  # the model stage on a CPU (core-seconds at the profile's threads)
    worker_cpu_s: float  # the worker outside the model (tokenizing, claims, upserts)
    web_cpu_s: float  # submission (parsing, staging with COPY)
    postgres_cpu_s: float
    redis_cpu_s: float
    postgres_bytes: float  # on disk, indexes included
    postgres_rows: float
    # The model's core-seconds per item by torch threads measured (they scale unevenly).
    model_cpu_s_at: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # JSON keys are text; a hand-edited cost is refused (ValueError: the loader's line).
        at = {int(k): float(v) for k, v in self.model_cpu_s_at.items()}
        object.__setattr__(self, "model_cpu_s_at", at)
        rest = [v for k, v in self.__dict__.items() if not k.startswith("model_cpu_s")]
        models_ok = all(math.isfinite(v) and v > 0 for v in (self.model_cpu_s, *at.values()))
        rest_ok = all(isinstance(v, int | float) and math.isfinite(v) and v >= 0 for v in rest)
        if not (models_ok and rest_ok and min(at, default=1) >= 1):
            raise ValueError("a cost that is not a number of seconds (the model's above 0)")

    def model_at(self, threads: int) -> float:
        """The model's core-seconds per item at `threads`, else at the profile's threads."""
        return self.model_cpu_s_at.get(threads, self.model_cpu_s)


@dataclass(frozen=True)
class InteractiveCost:
    """One interactive request's CPU seconds by tier at each measured level of clients
    (`levels`: clients, the median batch the worker ran, and web_cpu_s, worker_cpu_s,
    redis_cpu_s, client_cpu_s per request), the latency of a request alone, and the share
    of the machine's cores the path kept busy at its most clients."""

    levels: tuple[dict[str, float], ...]
    p50_ms_alone: float
    p99_ms_alone: float
    busy_share: float = 1.0

    def __post_init__(self) -> None:
        ordered = tuple(sorted((dict(x) for x in self.levels), key=lambda x: x["batch"]))
        if not ordered:
            raise ValueError("no interactive levels")
        for level in ordered:
            tail = level.get("p99_over_mean", 1.0)
            if isinstance(tail, bool) or not (
                isinstance(tail, int | float) and 0 < tail < math.inf
            ):
                raise ValueError("a level's p99 over its mean latency that is not above 0")
        object.__setattr__(self, "levels", ordered)

    def per_request(self, tier: str, batch: float) -> float:
        """`tier`'s CPU per request when batches hold `batch` requests: linear in 1/batch
        (a fixed cost per batch shared by its requests, plus a cost per request) between
        the measured batches, and flat beyond them."""
        points = [(1 / x["batch"], x[f"{tier}_cpu_s"]) for x in self.levels]
        return _between(points, 1 / max(1.0, batch))

    def p99_over_mean(self, clients: float) -> float:
        """A request's p99 over the mean latency when `clients` clients send back to back,
        as each level measured it (linear in log clients between levels, flat beyond). The
        tail's shape changes with the load: alone a request's p99 is the model's and the
        machine's outliers, several times its median; with many clients every request
        waits out batches, and the p99 is nearer the mean. A profile written without it:
        the ratio of p99 to p50 alone, at every load."""
        points = [
            (math.log(x["clients"]), x["p99_over_mean"])
            for x in self.levels
            if "p99_over_mean" in x
        ]
        if not points:
            return self.p99_ms_alone / self.p50_ms_alone
        return _between(points, math.log(max(1.0, clients)))

    def batch_at(self, clients: float) -> float:
        """The batch `clients` clients sending back to back fill: a power of the clients
        through the measured levels (log-linear between them, flat beyond)."""
        points = sorted((math.log(x["clients"]), math.log(x["batch"])) for x in self.levels)
        at = math.log(max(1.0, clients))
        if at <= points[0][0]:
            return math.exp(points[0][1])
        for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
            if x0 <= at <= x1:
                return math.exp(y0 if x1 == x0 else y0 + (y1 - y0) * (at - x0) / (x1 - x0))
        (x0, y0), (x1, y1) = points[-2:] if len(points) > 1 else (points[0], points[0])
        slope = (y1 - y0) / (x1 - x0) if x1 != x0 else 0.0
        return math.exp(y1 + slope * (at - x1))


def _between(points: list[tuple[float, float]], at: float) -> float:
    """y at `at` on the line through `points` (x, y), flat beyond the first and last."""
    points = sorted(points)
    if at <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 <= at <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (at - x0) / (x1 - x0)
    return points[-1][1]


@dataclass(frozen=True)
class Profile:
    version: int
    machine: dict[str, Any]  # cpu, cores, device, measured_at
    model: str
    worker_cores: int  # the torch threads of the worker that was measured
    batch: dict[str, BatchCost]
    interactive: dict[str, InteractiveCost]
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)  # cuda: items_per_s, source
    measured: dict[str, Any] = field(default_factory=dict)  # the benchmark's own figures


def profile_from_dict(data: Any) -> Profile:
    """A profile read from its JSON; a missing figure or another version is a PlanError."""
    if not isinstance(data, dict):
        raise PlanError("the profile is not a JSON object")
    version = data.get("version")
    if version != PROFILE_VERSION:
        raise PlanError(
            f"the profile is version {version}, this laneway reads version {PROFILE_VERSION}: "
            "run `laneway calibrate` again"
        )
    try:
        return Profile(
            version=version,
            machine=dict(data["machine"]),
            model=str(data["model"]),
            worker_cores=int(data["worker_cores"]),
            batch={t: BatchCost(**v) for t, v in data["batch"].items()},
            interactive={
                t: InteractiveCost(**{**v, "levels": tuple(v["levels"])})
                for t, v in data["interactive"].items()
            },
            devices=dict(data.get("devices") or {}),
            measured=dict(data.get("measured") or {}),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PlanError(f"the profile is incomplete or malformed ({exc!r})") from None


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    return asdict(profile)


# --- the target and the plan -----------------------------------------------------------


@dataclass(frozen=True)
class Target:
    batch: dict[tuple[str, str], float]  # (lane, task) -> items per hour
    interactive_rps: float = 0.0
    interactive_task: str = "classify"
    p99_ms: float = 500.0
    model: str = ""
    device: str = "cpu"  # where the gpu lane's and the interactive path's model runs
    device_rate: float | None = None  # the device's model items/s, where the profile has none
    device_source: str = ""


@dataclass(frozen=True)
class Prices:
    cpu: float  # per core-second
    gpu: float  # per device-second


@dataclass(frozen=True)
class Pools:
    """What each process holds open: the settings the processes themselves use."""

    postgres_pool: int
    postgres_overflow: int
    web_threads: int
    interactive_threads: int
    batch_max: int
    batch_wait_ms: float


def check_target(target: Target, profile: Profile) -> None:
    """Every way a target can be wrong, as one line each (PlanError)."""
    if target.interactive_rps < 0 or not math.isfinite(target.interactive_rps):
        raise PlanError("the interactive rate must be a positive number of requests/s")
    if not target.batch and target.interactive_rps <= 0:
        raise PlanError("nothing to plan: give a batch rate or an interactive rate")
    for (lane, task), per_hour in target.batch.items():
        if lane not in LANES:
            raise PlanError(f"unknown lane {lane!r}: expected one of {', '.join(LANES)}")
        if task not in TASKS:
            raise PlanError(f"unknown task {task!r}: expected one of {', '.join(TASKS)}")
        if not (per_hour > 0 and math.isfinite(per_hour)):
            raise PlanError(f"{lane}:{task} needs a positive number of items per hour")
        if task not in profile.batch:
            raise PlanError(f"the profile has no batch figures for {task!r}: calibrate it")
        if lane == "gpu" and target.device != "cuda":
            raise PlanError("the gpu lane runs its model on a GPU: plan it with --device cuda")
    if target.device not in DEVICES:
        raise PlanError(f"unknown device {target.device!r}: expected one of {', '.join(DEVICES)}")
    if target.interactive_rps > 0:
        if target.interactive_task not in TASKS:
            raise PlanError(f"unknown task {target.interactive_task!r}")
        if target.interactive_task not in profile.interactive:
            raise PlanError(
                f"the profile has no interactive figures for {target.interactive_task!r}"
            )
        if not (target.p99_ms > 0 and math.isfinite(target.p99_ms)):
            raise PlanError("the p99 must be a positive number of milliseconds")
    if target.model and target.model != profile.model:
        raise PlanError(f"the profile measured model {profile.model!r}, not {target.model!r}")
    if target.device_rate is not None and not (
        target.device_rate > 0 and math.isfinite(target.device_rate)
    ):
        raise PlanError("the device rate must be a positive number of items/s")
    if target.device == "cuda" and device_rate(target, profile) is None:
        raise PlanError("the profile has no GPU figure: give --device-rate (a GPU's model items/s)")


def device_rate(target: Target, profile: Profile) -> float | None:
    """One GPU's model items/s: the target's, else the profile's."""
    if target.device_rate is not None:
        return target.device_rate
    cuda = profile.devices.get("cuda") or {}
    return cuda.get("items_per_s")


def processes(cores: float, per_process: float) -> int:
    """Processes of `per_process` cores each to run `cores` at most HEADROOM busy."""
    if cores <= 0:
        return 0
    return math.ceil(cores / (per_process * HEADROOM) - 1e-9)


def plan(target: Target, profile: Profile, prices: Prices, pools: Pools) -> dict[str, Any]:
    """The plan for `target` as a JSON-able dict: rows of processes, the stores, the cost
    and, for the interactive path, the p99 the queue predicts or why none can meet it."""
    check_target(target, profile)
    per_core = profile.worker_cores
    rows: list[dict[str, Any]] = []
    web_cores = pg_cores = redis_cores = 0.0
    rows_per_s = bytes_per_s = 0.0
    batch_per_hour = sum(target.batch.values())
    batch_cost_hour = 0.0
    cpu_lane_cores, gpu_prep_cores, gpus = 0.0, 0.0, 0
    gpu_rate = device_rate(target, profile)
    for (lane, task), per_hour in sorted(target.batch.items()):
        rate, cost = per_hour / 3600, profile.batch[task]
        web_cores += rate * cost.web_cpu_s
        pg_cores += rate * cost.postgres_cpu_s
        redis_cores += rate * cost.redis_cpu_s
        rows_per_s += rate * cost.postgres_rows
        bytes_per_s += rate * cost.postgres_bytes
        if lane == "cpu":
            cpu_lane_cores += rate * (cost.model_cpu_s + cost.worker_cpu_s)
        else:
            gpu_prep_cores += rate * cost.worker_cpu_s
            gpus += math.ceil(rate / (gpu_rate * HEADROOM) - 1e-9)
    cpu_workers = processes(cpu_lane_cores + gpu_prep_cores, per_core)
    if cpu_workers:
        rows.append(_row("cpu worker", cpu_workers, per_core, cpu_lane_cores + gpu_prep_cores))
        batch_cost_hour += cpu_workers * per_core * prices.cpu * 3600
    if gpus:
        rows.append({"process": "gpu worker", "count": gpus, "cores_each": 0, "gpus": gpus,
                     "busy_cores": 0.0})  # fmt: skip
        batch_cost_hour += gpus * prices.gpu * 3600
    interactive = None
    interactive_cost_hour = 0.0
    if target.interactive_rps > 0:
        interactive = _interactive(target, profile, pools, gpu_rate)
        web_cores += target.interactive_rps * interactive["web_cpu_s"]
        redis_cores += target.interactive_rps * interactive["redis_cpu_s"]
        if interactive["feasible"]:
            n = interactive["processes"]
            if target.device == "cuda":
                rows.append({"process": "interactive worker", "count": n, "cores_each": 0,
                             "gpus": n, "busy_cores": 0.0})  # fmt: skip
                interactive_cost_hour += n * prices.gpu * 3600
            else:
                rows.append(_row("interactive worker", n, per_core, interactive["busy_cores"]))
                interactive_cost_hour += n * per_core * prices.cpu * 3600
    web = processes(web_cores, 1)  # a gunicorn process keeps about one core busy (the GIL)
    if web:
        rows.append(_row("web", web, 1, web_cores))
    interactive_n = interactive["processes"] if interactive and interactive["feasible"] else 0
    worker_n = cpu_workers + gpus + interactive_n
    postgres = {
        "cores": math.ceil(pg_cores / HEADROOM - 1e-9) if pg_cores > 0 else 1,
        "busy_cores": round(pg_cores, 3),
        "connections_steady": (worker_n + web) * pools.postgres_pool,
        "connections_max": (worker_n + web) * (pools.postgres_pool + pools.postgres_overflow),
        "rows_per_s": round(rows_per_s, 1),
        "write_mb_per_s": round(bytes_per_s / 1e6, 3),
        "disk_gb_per_day": round(bytes_per_s * 86400 / 1e9, 1),
    }
    # Backends, plus a cache over one hour of written rows (the rows jobs read back).
    postgres["memory_gib"] = round(
        postgres["connections_max"] * PG_BACKEND_MIB / 1024 + bytes_per_s * 3600 / 2**30, 2
    )
    redis = {
        "cores": math.ceil(redis_cores / HEADROOM - 1e-9) if redis_cores > 0 else 1,
        "busy_cores": round(redis_cores, 3),
        # a web thread blocks on a reply list; an interactive thread on a request list
        "connections_max": web * pools.web_threads
        + interactive_n * pools.interactive_threads
        + (cpu_workers + gpus) * 4,
        "memory_gib": REDIS_MEMORY_GIB,
    }
    store_cost = (postgres["cores"] + redis["cores"]) * prices.cpu * 3600
    web_cost = web * prices.cpu * 3600
    # Shared tiers (web, Postgres, Redis) are charged to each path by its share of their CPU.
    shared_batch = _share(target, profile)
    batch_cost_hour += (store_cost + web_cost) * shared_batch
    interactive_cost_hour += (store_cost + web_cost) * (1 - shared_batch)
    total = batch_cost_hour + interactive_cost_hour
    requests_hour = target.interactive_rps * 3600
    return {
        "profile": {"machine": profile.machine, "model": profile.model},
        "headroom": HEADROOM,
        "processes": rows,
        "postgres": postgres,
        "redis": redis,
        "interactive": interactive,
        "cost": {
            "per_hour": round(total, 4),
            "batch_per_hour": round(batch_cost_hour, 4),
            "interactive_per_hour": round(interactive_cost_hour, 4),
            "per_item": batch_cost_hour / batch_per_hour if batch_per_hour else None,
            "per_request": interactive_cost_hour / requests_hour if requests_hour else None,
            "cpu_price": prices.cpu,
            "gpu_price": prices.gpu,
        },
        "device": target.device,
        "device_rate": gpu_rate if target.device == "cuda" else None,
        "device_source": target.device_source
        or (profile.devices.get("cuda") or {}).get("source", ""),
    }


def _row(name: str, count: int, cores_each: int, busy: float) -> dict[str, Any]:
    return {"process": name, "count": count, "cores_each": cores_each, "gpus": 0,
            "busy_cores": round(busy, 3)}  # fmt: skip


def _share(target: Target, profile: Profile) -> float:
    """The batch path's share of the shared tiers' CPU (web, Postgres, Redis)."""
    batch = sum(
        per_hour / 3600 * (c.web_cpu_s + c.postgres_cpu_s + c.redis_cpu_s)
        for (_, task), per_hour in target.batch.items()
        for c in [profile.batch[task]]
    )
    cost = profile.interactive.get(target.interactive_task)
    inter = 0.0
    if cost and target.interactive_rps > 0:
        inter = target.interactive_rps * (
            cost.per_request("web", 64) + cost.per_request("redis", 64)
        )
    return batch / (batch + inter) if batch + inter > 0 else 1.0


def _service(
    cost: InteractiveCost, profile: Profile, batch: float, gpu_rate: float | None, device: str
) -> tuple[float, float]:
    """A request's service time on one server at `batch`, and its p99 with no queue (ms)."""
    if device == "cuda":
        # A device as one server at its published or measured rate; the rest of the path
        # (web, broker, reply) as measured alone, less the CPU model's share of it, plus
        # a whole batch's compute.
        alone = cost.per_request("worker", 1)
        base_ms = max(0.0, cost.p50_ms_alone - 1000 * alone / profile.worker_cores)
        return (
            1 / gpu_rate,
            base_ms + cost.p99_ms_alone - cost.p50_ms_alone + 1000 * batch / gpu_rate,
        )
    return cost.per_request("worker", batch), cost.p99_ms_alone


def _servers(rate: float, service: float, base_ms: float, p99_ms: float) -> int:
    """The fewest servers at most HEADROOM busy whose p99 (base + the queue's) meets p99_ms."""
    servers = max(1, math.ceil(rate * service / HEADROOM - 1e-9))
    while base_ms + 1000 * wait_quantile_s(servers, rate, service) > p99_ms:
        servers += 1
    return servers


def _interactive(
    target: Target, profile: Profile, pools: Pools, gpu_rate: float | None
) -> dict[str, Any]:
    """The interactive workers for `interactive_rps` at the p99: M/M/c over their cores (or
    devices), each request's service its worker CPU at the batches that rate fills, the
    p99 the queue's wait plus the p99 measured with one client."""
    cost = profile.interactive[target.interactive_task]
    rate = target.interactive_rps
    per_server = 1 if target.device == "cuda" else profile.worker_cores
    # Each process's share of the requests that arrive within one batch wait fills its
    # batches (up to the maximum); more processes make smaller batches, each request
    # costlier, so the count is iterated to its fixed point (it only grows).
    n = 1
    for _ in range(50):
        batch = max(1.0, min(pools.batch_max, rate / n * pools.batch_wait_ms / 1000))
        service, base_ms = _service(cost, profile, batch, gpu_rate, target.device)
        if base_ms >= target.p99_ms:
            break
        servers = _servers(rate, service, base_ms, target.p99_ms)
        if math.ceil(servers / per_server) <= n:
            break
        n = math.ceil(servers / per_server)
    out: dict[str, Any] = {
        "task": target.interactive_task,
        "requests_per_s": rate,
        "p99_target_ms": target.p99_ms,
        "p99_alone_ms": round(base_ms, 1),
        "service_ms": round(1000 * service, 3),
        "batch": round(batch, 1),
        "web_cpu_s": cost.per_request("web", batch),
        "redis_cpu_s": cost.per_request("redis", batch),
    }
    if base_ms >= target.p99_ms:
        out.update(feasible=False, processes=0, reason=(
            f"infeasible: a request alone already takes {base_ms:.0f} ms at p99, "
            f"above the {target.p99_ms:.0f} ms asked"))  # fmt: skip
        return out
    out.update(
        feasible=True,
        processes=n,
        servers=servers,
        busy_cores=round(rate * service, 3) if target.device == "cpu" else 0.0,
        utilization=round(rate * service / (n * per_server), 3),
        p99_ms=round(base_ms + 1000 * wait_quantile_s(n * per_server, rate, service), 1),
    )
    return out
