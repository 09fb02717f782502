"""tests/conftest.py: each pytest run, and under pytest-xdist each worker (`make check` and
`make test` run `-n 2`), holds a Redis index and a database of its own. A worker that took its
controller's would share queues, jobs and fleets with the other worker's tests."""

from __future__ import annotations

import os

import redis
from sqlalchemy.engine import make_url

from tests.conftest import REDIS_HOST, _state


def test_this_process_claimed_the_redis_index_and_database_it_runs_on(settings):
    index = int(settings.redis_url.rsplit("/", 1)[1])
    claims = redis.Redis.from_url(f"{REDIS_HOST}/0")
    # The claim in db 0 names the process that made it: this one, not an xdist controller.
    assert claims.get(f"laneway:test-db:{index}") == str(os.getpid()).encode()
    assert make_url(settings.database_url).database == _state["db_name"]
    assert _state["db_created"]  # created by this process, which drops it at the end
