"""Children that die with the `laneway` process that started them.

A wrapper killed with SIGKILL runs no handler, so it cannot stop its children: they would
live on as orphans (a celery worker taking chunks nobody supervises, a second gpu worker on
a device once the fleet restarts). On Linux each child asks the kernel, between fork and
exec, for a signal when its parent goes (prctl PR_SET_PDEATHSIG). A wrapper that stops in
order never triggers it: it waits for its children's warm shutdown before it exits.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# SIGKILL, as the wrapper got: the child dies at once, so a restarted wrapper never waits on
# (or runs beside) a worker finishing a chunk nobody supervises. Nothing is lost: celery's
# pool processes die with their parent the same way (celery sets it for them), gunicorn's
# workers leave when their master is gone, and the reconciler sends a chunk whose worker
# stopped beating again (docs/reliability.md).
PARENT_DEATH_SIGNAL = signal.SIGKILL


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up once, here: the child between fork and exec only calls it.
_PRCTL = _prctl()


def die_with_parent() -> Callable[[], None] | None:
    """A Popen `preexec_fn` that gives the child PARENT_DEATH_SIGNAL when this process
    exits; None where the platform has no such thing, or off the main thread: the kernel
    ties the signal to the *thread* that forks, and a helper thread's end (`laneway demo`'s
    supervisor) is no reason to kill what it started.
    """
    if _PRCTL is None or threading.current_thread() is not threading.main_thread():
        return None
    prctl, parent = _PRCTL, os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0)
        if os.getppid() != parent:
            # The parent died before the request took effect: nobody will signal us.
            os.kill(os.getpid(), PARENT_DEATH_SIGNAL)

    return preexec
