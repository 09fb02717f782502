"""Who this worker process is: its instance id, node name, queues and model device.

Set once, before the pool forks (workers/signals.py), and read by the model host, the
interactive server and the heartbeat, in the pool's children too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.vocab import INTERACTIVE_PREFIX

_worker: dict[str, Any] = {}


def set_worker(**fields: Any) -> None:
    _worker.update(fields)


def worker() -> dict[str, Any]:
    """instance, hostname, queues and device; empty outside a worker."""
    return _worker


def worker_queues() -> list[str] | None:
    """The queues this worker consumes (in its pool children too: set before the fork)."""
    return _worker.get("queues")


def is_interactive(queues: Sequence[str] | None) -> bool:
    """A worker of interactive queues alone (beside its own `<node>.dq` queue)."""
    queues = list(queues or ())
    return any(q.startswith(INTERACTIVE_PREFIX) for q in queues) and not {"cpu", "gpu"} & set(
        queues
    )
