"""A test that starts a process, in its fixtures or its body, carries the e2e or slow marker.

`make check` (-m "not e2e and not slow") is the loop that starts no process; a new test that
starts one unmarked fails here rather than slowing that loop unseen. Python's audit events
name every way of starting a process, so nothing is patched.
"""

from __future__ import annotations

import sys

import pytest

SPAWN_EVENTS = frozenset(
    {"subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty", "os.system"}
)
_spawned: list[str] = []
_SPAWNED_AT = pytest.StashKey[int]()


def _audit(event: str, args: tuple) -> None:
    if event in SPAWN_EVENTS:
        what = args[1] if event == "subprocess.Popen" else args[:1]
        _spawned.append(f"{event} {what!r}"[:200])


sys.addaudithook(_audit)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_SPAWNED_AT] = len(_spawned)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if call.when != "teardown" or report.failed or _SPAWNED_AT not in item.stash:
        return report
    started = _spawned[item.stash[_SPAWNED_AT] :]
    if started and not any(item.iter_markers("e2e")) and not any(item.iter_markers("slow")):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started {len(started)} process(es) but is marked neither slow nor"
            f" e2e (pyproject.toml [tool.pytest.ini_options] markers), so `make check` would"
            f" run it; the first: {started[0]}"
        )
    return report
