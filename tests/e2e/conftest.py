"""Each end-to-end test starts with a quiet fleet (earlier tests' open jobs cancelled, their
messages dropped: tests/broker.py says why) and leaves no process of its own running.

A test that only talks to the web app over HTTP shares one (`shared_web`): it holds no state
of its own between requests (jobs, accounts and limits live in Postgres and Redis), so
starting it once for the folder costs the tests nothing. Tests that stop, kill or configure
the web app start their own.
"""

import pytest


@pytest.fixture(autouse=True)
def quiet(settings, migrated):
    # Imported here, not at the top: pytest loads this file before the root conftest has
    # pointed the settings at this run's database and Redis.
    from tests.broker import quiet_fleet

    yield from quiet_fleet(settings)


@pytest.fixture(scope="package")
def shared_web(migrated, tmp_path_factory):
    """(process, url) of the web app with the run's settings, started once for tests/e2e."""
    from tests.e2e.procs import start_web

    proc, url = start_web(tmp_path_factory.mktemp("shared-web"))
    yield proc, url
    proc.stop()
