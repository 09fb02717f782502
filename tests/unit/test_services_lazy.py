"""tests/conftest.py: pure unit tests need no service, and a test that needs one says which
(pytest runs of their own, in child processes, with the services pointed at a closed port)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLOSED_PG = "postgresql://postgres@127.0.0.1:1/postgres"
CLOSED_REDIS = "redis://127.0.0.1:1"
NEEDS_SERVICES = "tests/integration/test_accounts.py::test_cli_manages_accounts_and_keys"


def run(pytester, monkeypatch, *args: str, **env: str):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.chdir(ROOT)  # the repository's pyproject.toml and conftest, as `make check` runs
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "not slow", *args)


@pytest.mark.slow  # pytest runs in child processes
def test_unit_tests_pass_with_postgres_and_redis_unreachable(pytester, monkeypatch):
    result = run(
        pytester,
        monkeypatch,
        "tests/unit/test_inputs.py",
        NEEDS_SERVICES,
        LANEWAY_TEST_PG=CLOSED_PG,
        LANEWAY_TEST_REDIS=CLOSED_REDIS,
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) > 20 and outcomes.get("failed", 0) == 0
    assert outcomes.get("errors") == 1, result.outlines[-20:]
    result.stdout.fnmatch_lines(
        ["*this test needs Redis at redis://127.0.0.1:1 (LANEWAY_TEST_REDIS), which did not*"]
    )


@pytest.mark.slow  # a pytest run in a child process
def test_a_test_that_needs_the_database_names_it_when_postgres_is_unreachable(
    pytester, monkeypatch
):
    result = run(pytester, monkeypatch, NEEDS_SERVICES, LANEWAY_TEST_PG=CLOSED_PG)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [f"*this test needs Postgres at {CLOSED_PG} (LANEWAY_TEST_PG), which did not answer*"]
    )
