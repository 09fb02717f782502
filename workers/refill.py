"""A worker's refills of its lane, off the path from one chunk to the next.

When a chunk ends, its slot on the lane goes to the next waiting chunk (jobs/fairshare.py).
That refill is a short transaction and a send; run inline, the worker would take its own
next chunk (already waiting in the broker: the window keeps one per worker) only after
it. Here it runs on one thread of the worker process while the worker goes on, and
refills of one lane asked for while one is pending are one: each reads the lane afresh.

Should the process die with a refill pending, the reconciler's next round refills the lane.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from core.config.settings import Settings
from jobs import fairshare

_lock = threading.Lock()
_pending: set[str] = set()
_executor: ThreadPoolExecutor | None = None
_owner = 0  # the pid that made the executor: a forked child makes its own


# Seconds the refill thread lets the worker have first: time to acknowledge its chunk and
# claim its next one, Python work that would otherwise take turns on the GIL with the
# refill's; by then the worker is in the model, which runs without the GIL. The window's
# spare chunk per worker covers the wait many times over.
HEAD_START = 0.05


def _run(settings: Settings, lane: str) -> None:
    time.sleep(HEAD_START)
    with _lock:
        _pending.discard(lane)  # a refill asked for from now on reads what this one wrote
    fairshare.safe_refill(settings, lane)


def refill_soon(settings: Settings, lane: str) -> None:
    """Refill `lane` on the worker's refill thread, unless one is already pending."""
    global _executor, _owner
    with _lock:
        if _executor is None or _owner != os.getpid():
            _executor, _owner = ThreadPoolExecutor(1, "laneway-refill"), os.getpid()
            _pending.clear()
        if lane in _pending:
            return
        _pending.add(lane)
        executor = _executor
    executor.submit(_run, settings, lane)


def drain() -> None:
    """Wait for the refills asked for so far (at exit, and for tests)."""
    with _lock:
        executor = _executor if _owner == os.getpid() else None
    if executor is None:
        return
    try:
        executor.submit(lambda: None).result()
    except RuntimeError:
        # At interpreter exit concurrent.futures' own hook (run before atexit's) has
        # already refused new work and waited for the queued refills: nothing is pending.
        pass


atexit.register(drain)
