"""Each fault test starts with a quiet fleet (earlier tests' open jobs cancelled, their
messages dropped, even those delivered to workers now gone: tests/broker.py says why) and
leaves no process of its own running."""

import pytest


@pytest.fixture(autouse=True)
def quiet(settings, migrated):
    # Imported here, not at the top: pytest loads this file before the root conftest has
    # pointed the settings at this run's database and Redis.
    from tests.broker import quiet_fleet

    yield from quiet_fleet(settings, unacked=True)
