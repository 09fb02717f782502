"""One gpu worker per device: an flock'ed file per (host, device) under LANEWAY_HOME.

The supervisor takes the lock before it starts a device's worker and hands the open file to
the worker (the lock belongs to the open file, so it lasts while the worker or any process
it forked holds it, and the kernel drops it when the last one exits, however it dies). A
restarted `laneway fleet`, or a `laneway worker gpu` beside it, finds the device taken and
waits, instead of starting a second worker on it next to one a killed supervisor left.
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path


def lock_path(home: Path, device: str) -> Path:
    # The host in the name: LANEWAY_HOME may be a volume that several machines share.
    return home / "locks" / f"gpu-{socket.gethostname()}-{device}.lock"


def take(path: Path) -> int | None:
    """An open descriptor holding the lock at `path`, or None when another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def record_holder(fd: int, pid: int) -> None:
    """Write the pid of the process that holds the lock (for the operator; the lock itself,
    not this number, says whether the device is taken)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{pid}\n".encode(), 0)


def holder(path: Path) -> str:
    """The pid last recorded in the lock file, for a log line ("?" when unknown)."""
    try:
        return path.read_text().strip() or "?"
    except OSError:
        return "?"
