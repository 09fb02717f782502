"""Pure planning: which lane a job runs on, and how it is cut into chunks."""

from __future__ import annotations

from laneway.settings import ACCOUNT_TYPES

# Demo and trial traffic is small and interactive: it never waits for a GPU to start.
CPU_ONLY_ACCOUNTS = frozenset({"demo", "trial"})


def choose_lane(account_type: str, n_items: int, gpu_threshold: int) -> str:
    """`gpu` for a standard or enterprise job above the threshold, else `cpu`."""
    if account_type not in ACCOUNT_TYPES:
        raise ValueError(f"unknown account type {account_type!r}")
    if n_items < 0:
        raise ValueError("n_items must not be negative")
    if account_type in CPU_ONLY_ACCOUNTS:
        return "cpu"
    return "gpu" if n_items > gpu_threshold else "cpu"


def plan_chunks(n_items: int, chunk_size: int) -> list[tuple[int, int]]:
    """Half-open item ranges [start, stop) of at most chunk_size items, covering 0..n_items."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    return [(start, min(start + chunk_size, n_items)) for start in range(0, n_items, chunk_size)]
