"""What this host (or the container it runs in) gives Laneway's processes: cores and memory.

Python's `os.cpu_count()` counts the machine's cores, not the ones a container may use: a
pod limited to two cores on a 64-core node would start 64 workers of torch threads that
contend for two. The usable cores are the process's CPU affinity, bounded by a cgroup v2
CPU quota (`cpu.max`); the usable memory is the kernel's MemAvailable, bounded by what a
cgroup v2 memory limit (`memory.max`) leaves. Both read the files under `root` (`/`), so
tests give a folder of their own.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

CGROUP = "sys/fs/cgroup"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


@functools.cache
def usable_cores(root: Path = Path("/")) -> int:
    """The cores this process may run on: its affinity, within its cgroup's CPU quota; read
    once per process (every Settings and every chunk's step-aside asks)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = (_read(root / CGROUP / "cpu.max") or "max").split()
    if len(quota) == 2 and quota[0] != "max":
        try:
            cores = min(cores, math.ceil(int(quota[0]) / int(quota[1])))
        except (ValueError, ZeroDivisionError):
            pass
    return max(1, cores)


def available_memory(root: Path = Path("/")) -> int | None:
    """Bytes this process could still take: MemAvailable, within its cgroup's memory limit
    (the limit less what the cgroup already holds). None when neither can be read."""
    found: list[int] = []
    for line in (_read(root / "proc/meminfo") or "").splitlines():
        fields = line.split()
        if fields[:1] == ["MemAvailable:"] and len(fields) > 1 and fields[1].isdigit():
            found.append(int(fields[1]) * 1024)  # in kB
    limit, current = _read(root / CGROUP / "memory.max"), _read(root / CGROUP / "memory.current")
    if limit and limit.isdigit() and current and current.isdigit():
        found.append(max(0, int(limit) - int(current)))
    return min(found) if found else None
