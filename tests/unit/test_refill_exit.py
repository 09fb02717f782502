"""A worker process that exits with its refill thread made (workers/refill.py) exits
cleanly: the at-exit drain meets an executor that concurrent.futures has already shut."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = """
from workers import refill
from jobs import fairshare
done = []
fairshare.safe_refill = lambda settings, lane: done.append(lane)
refill.refill_soon(None, "cpu")
refill.drain()
assert done == ["cpu"], done
refill.refill_soon(None, "gpu")  # pending, or run, when the interpreter exits
"""


@pytest.mark.slow
def test_exit_with_a_refill_thread_says_nothing_and_exits_zero():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr
