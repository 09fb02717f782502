"""Who this worker process is: its instance id, node name, queues and model device.

Set once, before the pool forks (workers/signals.py), and read by the model host, the
interactive server and the heartbeat, in the pool's children too.
"""

from __future__ import annotations

from typing import Any

_worker: dict[str, Any] = {}


def set_worker(**fields: Any) -> None:
    _worker.update(fields)


def worker() -> dict[str, Any]:
    """instance, hostname, queues and device; empty outside a worker."""
    return _worker


def worker_queues() -> list[str] | None:
    """The queues this worker consumes (in its pool children too: set before the fork)."""
    return _worker.get("queues")
