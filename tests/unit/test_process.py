"""core/util/process.pid(): this process's id, renewed in a forked child."""

from __future__ import annotations

import os

import pytest

from core.util import process


@pytest.mark.slow  # forks a process
def test_a_forked_child_has_its_own_pid():
    assert process.pid() == os.getpid()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its answer, then out at once
        os.write(write, b"1" if process.pid() == os.getpid() else b"0")
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    assert os.read(read, 1) == b"1"
    os.close(read)
    assert process.pid() == os.getpid()
