"""Per-minute usage of the interactive lanes, kept in Redis for the dashboard.

Interactive requests are never stored in Postgres (they are answered in milliseconds), so
the dashboard's throughput and cost per item of those lanes come from counters the
interactive worker adds to once per batch: one hash per lane and minute (items answered,
CPU seconds of the pre and post stages, model seconds by device), written in one round
trip and kept two hours, twice what the dashboard shows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

PREFIX = "laneway:usage:"
TTL = 2 * 3600
MODEL_FIELD = "model_seconds:"  # + the device


@dataclass
class Minute:
    """One lane's usage in one minute."""

    items: int = 0
    cpu_seconds: float = 0.0
    model_seconds: dict[str, float] = field(default_factory=dict)  # by device


def minute_key(lane: str, minute: int) -> str:
    return f"{PREFIX}{lane}:{minute}"


def record_commands(
    lane: str,
    items: int,
    cpu_seconds: float,
    model_seconds: float,
    device: str,
    now: float | None = None,
) -> list[tuple[Any, ...]]:
    """The commands that add one batch to its lane's current minute, for a round trip the
    caller makes (the interactive worker's, with the batch's cache entries)."""
    key = minute_key(lane, int((time.time() if now is None else now) // 60))
    return [
        ("HINCRBY", key, "items", items),
        ("HINCRBYFLOAT", key, "cpu_seconds", float(cpu_seconds)),
        ("HINCRBYFLOAT", key, MODEL_FIELD + device, float(model_seconds)),
        ("EXPIRE", key, TTL),
    ]


def last_hour(
    r: redis.Redis, lanes: Sequence[str], now: float
) -> dict[str, list[tuple[float, Minute]]]:
    """Per lane, each of the last 60 minutes that saw work: (seconds since its start,
    its usage), in one round trip."""
    current = int(now // 60)
    minutes = range(current - 59, current + 1)
    with r.pipeline(transaction=False) as pipe:
        for lane in lanes:
            for minute in minutes:
                pipe.hgetall(minute_key(lane, minute))
        rows = iter(pipe.execute())
    found: dict[str, list[tuple[float, Minute]]] = {}
    for lane in lanes:
        found[lane] = []
        for minute in minutes:
            row = {k.decode(): v.decode() for k, v in next(rows).items()}
            if row:
                found[lane].append((now - minute * 60, _parse(row)))
    return found


def _parse(row: dict[str, str]) -> Minute:
    return Minute(
        items=int(row.get("items", 0)),
        cpu_seconds=float(row.get("cpu_seconds", 0.0)),
        model_seconds={
            name[len(MODEL_FIELD) :]: float(value)
            for name, value in row.items()
            if name.startswith(MODEL_FIELD)
        },
    )
