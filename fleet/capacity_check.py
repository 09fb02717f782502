"""A profile's predictions for the machine it was measured on, beside what a later
calibration measured there (`laneway plan --check-against`): batch items/s per number of
workers, and requests/s and p99 for N clients sending back to back. docs/operations.md
("The check") states each rule."""

from __future__ import annotations

import math
from typing import Any

from fleet.capacity import Profile


def predict_batch_rate(profile: Profile, task: str, workers: int, threads: int) -> float:
    """Items/s of `workers` cpu workers of `threads` torch threads each on the measured
    machine, with Postgres and Redis on it too: the lesser of the workers' cores and the
    machine's cores over each one's CPU per item."""
    cost, cores = profile.batch[task], profile.machine["cores"]
    worker_cores = min(cores, workers * threads)
    per_item = cost.model_at(threads) + cost.worker_cpu_s
    everything = per_item + cost.postgres_cpu_s + cost.redis_cpu_s + cost.web_cpu_s
    return min(worker_cores / per_item, cores / everything)


def predict_closed_loop(profile: Profile, task: str, clients: int) -> dict[str, float]:
    """Requests/s and p99 of `clients` clients sending back to back on the measured
    machine: the lesser of what the clients ask at the latency alone and what the path's
    share of the machine's cores serves at the batches `clients` fill (the latency alone
    is its mean: the p99 alone over the tail measured alone); by Little's law the
    mean latency is clients over requests/s, and the p99 is the mean times the tail the
    measured levels give at `clients` (InteractiveCost.p99_over_mean)."""
    cost, cores = profile.interactive[task], profile.machine["cores"]
    batch = cost.batch_at(clients)
    per_request = sum(cost.per_request(t, batch) for t in ("web", "worker", "redis", "client"))
    # A client alone sends its next request when it has its answer: 1000 over the mean
    # latency alone a second, which a heavy tail puts above the median.
    alone_ms = cost.p99_ms_alone / cost.p99_over_mean(1)
    rps = min(clients * 1000 / alone_ms, cores * cost.busy_share / per_request)
    mean_ms = clients * 1000 / rps
    return {"requests_per_s": rps, "p99_ms": mean_ms * cost.p99_over_mean(clients)}


def checks(profile: Profile, measured: dict[str, Any], tolerance: float = 0.2) -> list[dict]:
    """The predictions of `profile` for its own machine beside what a later run of the
    benchmarks measured there (another profile's `measured`): batch items/s per worker count
    and, per client count, interactive requests/s and p99; each row within `tolerance`?"""
    rows: list[dict[str, Any]] = []

    def row(what: str, predicted: float, seen: float) -> None:
        error = predicted / seen - 1 if seen else math.inf
        rows.append({"check": what, "predicted": round(predicted, 1), "measured": seen,
                     "error": round(error, 3), "within": abs(error) <= tolerance})  # fmt: skip

    for task, runs in (measured.get("batch") or {}).items():
        if task not in profile.batch:
            continue
        for run in runs:
            predicted = predict_batch_rate(profile, task, run["workers"], run["threads"])
            row(f"batch {task}, {run['workers']} worker(s) items/s", predicted,
                run["items_per_s"])  # fmt: skip
    for task, levels in (measured.get("interactive") or {}).items():
        if task not in profile.interactive:
            continue
        for level in levels:
            predicted = predict_closed_loop(profile, task, level["clients"])
            row(f"interactive {task}, {level['clients']} clients requests/s",
                predicted["requests_per_s"], level["requests_per_s"])  # fmt: skip
            row(f"interactive {task}, {level['clients']} clients p99 ms",
                predicted["p99_ms"], level["p99_ms"])  # fmt: skip
    return rows
