"""Children that die with the `laneway` process that started them.

A wrapper killed with SIGKILL runs no handler, so it cannot stop its children: they would
live on as orphans (a celery worker taking chunks nobody supervises, a second gpu worker on
a device once the fleet restarts). On Linux each child asks the kernel, between fork and
exec, for SIGTERM when its parent goes (prctl PR_SET_PDEATHSIG): celery, gunicorn, beat and
Flower then shut down as they do on `docker stop`, warm, taking their own children along.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# SIGTERM, not SIGKILL: a celery worker finishes (and acks) its chunk and stops its pool,
# gunicorn stops its workers; a SIGKILLed celery parent would leave its pool behind.
PARENT_DEATH_SIGNAL = signal.SIGTERM


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
    exits; None where the platform has no such thing.

    The kernel ties the signal to the *thread* that forks: start children from the main
    thread (a child started by a helper thread is signalled when that thread ends).
    """
    if _PRCTL is None:
        return None
    prctl, parent = _PRCTL, os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0)
        if os.getppid() != parent:
            # The parent died before the request took effect: nobody will signal us.
            os.kill(os.getpid(), PARENT_DEATH_SIGNAL)

    return preexec
