"""Each test's CPU, with the processes it started, when LANEWAY_TEST_CPU names a file.

The suite's time on a 2-core machine is its CPU: its cores are busy most of a `make test`
run, so the tests to make cheaper are the ones that use the most CPU, not the ones that wait
longest. Each xdist worker appends a line per test to the file: the test's id and the CPU
seconds (user and system) of the worker and of every process it started and reaped while
the test ran (its module's shared fleet counts to the test whose teardown stops it). A
process killed together with its parent is reaped by init and not counted, so the figures
are a floor. `tools/suite_cpu.py FILE` sums them by file.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator

import pytest

REPORT = os.environ.get("LANEWAY_TEST_CPU")


def cpu_seconds() -> float:
    """User and system CPU of this process and of the children it has reaped."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not REPORT:
        yield
        return
    before = cpu_seconds()
    yield
    spent = cpu_seconds() - before
    with open(REPORT, "a", encoding="utf-8") as fh:  # one short line: appends do not mix
        fh.write(f"{spent:.2f}\t{item.nodeid}\n")
