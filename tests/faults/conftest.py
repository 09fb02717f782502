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


@pytest.fixture(params=["redis", "rabbitmq"])
def lanes(request, settings, monkeypatch):
    """The settings of a test run on each broker of the batch lanes: this run's Redis, or a
    RabbitMQ vhost of the test's own (tests/rabbit.py), which every process it starts uses."""
    if request.param == "redis":
        yield settings
        return
    from tests.rabbit import on_rabbitmq

    with on_rabbitmq(settings, monkeypatch) as rabbit:
        yield rabbit
