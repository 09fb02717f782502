"""tests/spawnguard.py: a test that starts a process unmarked fails; marked, or starting
none, it passes (a pytest run of its own, in a child process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TESTS = """
import multiprocessing
import os
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def child():
    return subprocess.run([sys.executable, "-c", "pass"]).returncode


def test_runs_a_tool_unmarked():
    subprocess.run(["true"], check=True)


def test_starts_a_child_in_a_module_fixture_unmarked(child):
    assert child == 0


def test_forks_unmarked():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


@pytest.mark.slow
def test_runs_a_tool_marked_slow():
    subprocess.run(["true"], check=True)


@pytest.mark.e2e
def test_runs_a_tool_marked_e2e():
    subprocess.run(["true"], check=True)


def test_starts_nothing():
    assert sum(range(4)) == 6


def test_fails_and_starts_a_tool_unmarked():
    subprocess.run(["true"], check=True)
    assert False, "its own failure"
"""


@pytest.mark.slow  # a pytest run in a child process
def test_only_a_marked_test_may_start_a_process(pytester, monkeypatch):
    pytester.makeconftest('pytest_plugins = ["tests.spawnguard"]')
    pytester.makeini(
        "[pytest]\naddopts = --strict-markers -p no:cacheprovider\n"
        "markers =\n    slow: starts a process\n    e2e: starts a fleet\n"
    )
    pytester.makepyfile(test_spawning=TESTS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("-rA")
    # Each unmarked start errors at teardown, naming the test and what it started; a test
    # that fails on its own keeps its failure beside that error.
    result.assert_outcomes(passed=6, errors=4, failed=1)
    errors = [line for line in result.outlines if line.startswith("ERROR ")]
    assert sorted(line.split("::")[1].split(" ")[0] for line in errors) == [
        "test_fails_and_starts_a_tool_unmarked",
        "test_forks_unmarked",
        "test_runs_a_tool_unmarked",
        "test_starts_a_child_in_a_module_fixture_unmarked",
    ]
    unmarked = (
        "*test_runs_a_tool_unmarked started 1 process(es) but is marked neither slow nor e2e*"
    )
    result.stdout.fnmatch_lines([unmarked + "the first: subprocess.Popen ?'true'?"])
    result.stdout.fnmatch_lines(["E*AssertionError: its own failure"])
