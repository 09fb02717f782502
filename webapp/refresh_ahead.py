"""Reads a web process runs out of its requests' way: the API keys in use
(webapp/keycache.py) and the interactive lanes' registry (webapp/interactive_client.py)
are read again before their copies lapse, on this process's one small pool, so that a
steady caller's request never waits on Postgres."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from core.util import process

_pools: dict[int, ThreadPoolExecutor] = {}  # by pid: a forked child makes its own
_lock = threading.Lock()


def read_ahead(job: Callable[[], None]) -> Future:
    """Run `job` on this process's read-ahead pool. Raises RuntimeError once the pool can
    take no more (the interpreter is shutting down): the caller then does without."""
    pid = process.pid()
    with _lock:
        pool = _pools.get(pid)
        if pool is None:
            pool = _pools[pid] = ThreadPoolExecutor(2, thread_name_prefix="laneway-ahead")
    return pool.submit(job)
