"""This process's id, for what runs on every request and must tell a forked child from
its parent (a memo per process, a thread started once per process, tracing set up in this
process): kept here and renewed in a forked child, since os.getpid() is a system call each
time it is asked."""

from __future__ import annotations

import os

_pid = os.getpid()


def pid() -> int:
    """This process's id (renewed at fork)."""
    return _pid


def _renew() -> None:
    global _pid
    _pid = os.getpid()


# Registered on import, before any module that reads pid() in a hook of its own.
os.register_at_fork(after_in_child=_renew)
