"""Children die with the process that started them (PR_SET_PDEATHSIG), even when it is
killed with SIGKILL and runs no handler; real processes, no services."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from fleet.lifeline import die_with_parent

pytestmark = pytest.mark.skipif(die_with_parent() is None, reason="Linux only")

# A parent that starts a child (with or without the lifeline), prints its pid and waits.
PARENT = """
import subprocess, sys, time
from fleet.lifeline import die_with_parent
preexec = die_with_parent() if sys.argv[1] == "on" else None
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         preexec_fn=preexec)
print(child.pid, flush=True)
time.sleep(120)
"""


def start_parent(lifeline: str) -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, lifeline], stdout=subprocess.PIPE, text=True
    )
    return parent, int(parent.stdout.readline())


def gone(pid: int, timeout: float) -> bool:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


@pytest.mark.slow
def test_a_child_dies_when_its_parent_is_killed():
    parent, child = start_parent("on")
    assert psutil.pid_exists(child)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    assert gone(child, 10), "the child outlived its SIGKILLed parent"


@pytest.mark.slow
def test_without_the_lifeline_the_child_is_orphaned():
    """The contrast: the same parent without it leaves its child running."""
    parent, child = start_parent("off")
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        # The kernel sends the lifeline's signal as it hands the child to a new parent:
        # once the child has one, it would have been signalled already.
        orphan = psutil.Process(child)
        deadline = time.monotonic() + 10
        while orphan.ppid() == parent.pid and time.monotonic() < deadline:
            time.sleep(0.05)
        assert orphan.ppid() != parent.pid
        assert orphan.is_running() and orphan.status() != psutil.STATUS_ZOMBIE
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_helper_thread_sets_no_lifeline():
    """The kernel would signal the child when that thread ends, not when the process does."""
    import threading

    found = []
    helper = threading.Thread(target=lambda: found.append(die_with_parent()))
    helper.start()
    helper.join()
    assert found == [None]
