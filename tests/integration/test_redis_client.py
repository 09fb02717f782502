"""One Redis client per process and URL (core/store/redis_conn.redis_client), and the
round trips made on a thread's own connection (`round_trip`)."""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import uuid

import pytest
import redis

from core.store import redis_conn
from core.store.redis_conn import redis_client, round_trip


class _NotASocket:
    """A socket behind another object, as a TLS socket is another object than a plain one."""

    def __init__(self, sock) -> None:
        self._sock = sock

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


class _WrappedConnection(redis.Connection):
    def _connect(self):
        return _NotASocket(super()._connect())


# A round trip writes and reads a plain socket itself; any other takes redis-py's own calls.
PATHS = {"direct": {}, "redis-py": {"connection_class": _WrappedConnection}}


@pytest.fixture(params=sorted(PATHS))
def path(request) -> dict:
    return PATHS[request.param]


@pytest.fixture
def client(settings, path) -> redis.Redis:
    return redis.Redis.from_url(settings.redis_url, socket_timeout=5, **path)


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


def _client_id(r: redis.Redis) -> int:
    return round_trip(r, [("CLIENT", "ID")])[0]


def test_a_round_trip_answers_each_command_in_order_on_the_thread_s_own_connection(client):
    r = client
    key = f"laneway:test:trip:{uuid.uuid4().hex}"
    got = round_trip(r, [("DEL", key), ("RPUSH", key, b"a", b"b"), ("LRANGE", key, 0, -1)])
    assert got == [0, 2, [b"a", b"b"]]  # raw replies, as the server sent them
    mine = _client_id(r)
    assert _client_id(r) == mine  # kept by this thread
    others: list[int] = []
    thread = threading.Thread(target=lambda: others.append(_client_id(r)))
    thread.start()
    thread.join()
    assert others and others[0] != mine  # another thread's is its own


def test_an_error_reply_raises_after_every_reply_is_read(client):
    r = client
    key = "laneway:test:trip-error"
    r.set(key, "not a list", ex=30)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        round_trip(r, [("RPUSH", key, b"x"), ("GET", key)])
    # The GET's reply was read too: the next call gets its own answer, not a late one.
    assert round_trip(r, [("GET", key)]) == [b"not a list"]


def test_a_connection_the_server_closed_is_made_again_before_the_write(settings, client):
    r = client
    first = _client_id(r)
    assert redis_client(settings).client_kill_filter(_id=first) == 1
    assert round_trip(r, [("PING",)]) == [b"PONG"]  # not a lost first call
    assert _client_id(r) != first


def test_a_timeout_drops_the_connection_so_no_late_reply_answers_the_next_call(settings, path):
    quick = redis.Redis.from_url(settings.redis_url, socket_timeout=0.2, **path)
    key = "laneway:test:trip-late"
    first = _client_id(quick)
    with pytest.raises(redis.TimeoutError):
        round_trip(quick, [("DEL", key), ("BLPOP", key, 1)])
    redis_client(settings).rpush(key, b"late")  # what the dropped BLPOP could have taken
    assert _client_id(quick) != first
    assert round_trip(quick, [("LPOP", key)]) == [b"late"]


@pytest.mark.slow
def test_a_forked_child_makes_a_round_trip_on_a_connection_of_its_own(settings) -> None:
    r = redis_client(settings)
    parent = _client_id(r)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never the parent's socket
        try:
            os.write(write, str(_client_id(r)).encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    os.close(write)
    child = int(os.read(read, 64))
    os.close(read)
    assert child != parent
    assert _client_id(r) == parent  # the parent's connection unharmed


def _wire(r: redis.Redis):
    return redis_conn._own.conns[r.connection_pool]


def test_a_plain_socket_is_read_and_written_directly_under_the_kernel_s_timeouts(settings):
    r = redis.Redis.from_url(settings.redis_url, socket_timeout=2.5)
    assert round_trip(r, [("PING",)]) == [b"PONG"]
    sock = _wire(r).sock
    assert sock is not None and sock.gettimeout() is None  # blocking: no poll before each call
    limit = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.calcsize("ll"))
    assert struct.unpack("ll", limit) == (2, 500_000)
    wrapped = redis.Redis.from_url(settings.redis_url, socket_timeout=2.5, **PATHS["redis-py"])
    assert round_trip(wrapped, [("PING",)]) == [b"PONG"]
    assert _wire(wrapped).sock is None  # redis-py's own calls, its own timeout


def test_replies_longer_than_one_read_come_back_whole_and_in_order(client):
    key = f"laneway:test:trip-long:{uuid.uuid4().hex}"
    big = bytes(range(256)) * 1200  # several reads' worth
    got = round_trip(
        client, [("DEL", key), ("SET", key, big, "EX", 30), ("GET", key), ("GET", key)]
    )
    assert got == [0, b"OK", big, big]
    assert round_trip(client, [("STRLEN", key)]) == [len(big)]


def test_a_reply_nobody_read_is_found_before_the_write_and_never_answers(settings):
    r = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
    key = "laneway:test:trip-stray"
    round_trip(r, [("SET", key, b"mine", "EX", 30)])
    first = _client_id(r)
    sock = _wire(r).sock
    sock.sendall(b"*1\r\n$4\r\nPING\r\n")  # a command whose reply nobody reads
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    assert poller.poll(5000)  # the stray reply is there
    assert round_trip(r, [("GET", key)]) == [b"mine"]  # not the stray +PONG
    assert _client_id(r) != first


def test_a_client_that_decodes_gets_text(settings, path):
    r = redis.Redis.from_url(settings.redis_url, socket_timeout=5, decode_responses=True, **path)
    key = "laneway:test:trip-text"
    assert round_trip(r, [("SET", key, "é", "EX", 30), ("GET", key)]) == ["OK", "é"]
    lenient = redis.Redis.from_url(
        settings.redis_url, decode_responses=True, encoding_errors="replace", **path
    )
    round_trip(r, [("SET", key, b"\xff", "EX", 30)])
    assert round_trip(lenient, [("GET", key)]) == ["\ufffd"]  # the client's own error handling


def test_an_error_reply_is_the_exception_redis_py_gives_it(client):
    with pytest.raises(redis.exceptions.NoScriptError):  # a ResponseError of its own class
        round_trip(client, [("EVALSHA", "0" * 40, 0)])
    assert round_trip(client, [("PING",)]) == [b"PONG"]
