"""One Redis client per process and URL (core/store/redis_conn.redis_client)."""

from __future__ import annotations

import os

import pytest

from core.store.redis_conn import redis_client


def test_callers_share_one_client_per_url_and_its_connections(settings) -> None:
    a, b = redis_client(settings), redis_client(settings.replace())
    assert a is b
    other = redis_client(settings.replace(redis_url=settings.redis_url.rsplit("/", 1)[0] + "/15"))
    assert other is not a
    a.set("laneway:test:shared", "1", ex=30)
    made = a.connection_pool._created_connections  # other tests in this process may have made some
    for _ in range(5):
        assert a.get("laneway:test:shared") == b"1"
    # Commands one after another reuse a connection: no new handshake per call.
    assert a.connection_pool._created_connections == made


@pytest.mark.slow
def test_a_forked_child_gets_connections_of_its_own(settings) -> None:
    r = redis_client(settings)
    r.set("laneway:test:fork", "parent", ex=30)
    parent_conn = r.connection_pool._available_connections[0]
    pid = os.fork()
    if pid == 0:  # the child: the inherited pool starts afresh (redis-py checks the pid)
        code = 1
        try:
            r.set("laneway:test:fork", "child", ex=30)
            mine = r.connection_pool._available_connections
            code = 0 if mine and mine[0] is not parent_conn else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert r.get("laneway:test:fork") == b"child"
    assert r.ping()  # the parent's connection still works after the child's
