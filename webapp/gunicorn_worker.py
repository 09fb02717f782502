"""gunicorn's threaded worker for `laneway web`, with a kept-alive connection's next
request read by the thread that answered its last one, when it comes at once.

gunicorn's gthread worker hands every kept-alive connection back to its main thread after
each answer: the thread that answered defers it through a pipe, the main thread wakes and
registers the socket with its poller, wakes again when the next request's bytes arrive,
unregisters it and submits it to the pool, where a thread wakes to read it. On the
interactive path, where a caller sends its next request as soon as it has its answer,
those hand-offs cost the web process CPU and thread switches on every request. Here the
thread that answered waits up to LINGER seconds for the connection's next request and
serves it itself, while at most a quarter of the pool's threads are serving connections
and the worker is not stopping; otherwise, or when nothing comes in time, the connection
goes back to the poller as gunicorn sends it. The quarter: with many callers at once (every
core taken), a thread that serves its own connection's next request at once serves it
ahead of requests already waiting for the poller, and the slowest callers wait longer; few
threads busy means few callers, who gain. Under a gunicorn whose `handle` returns
anything but True for a kept-alive connection (older releases return a pair), it never
lingers: gunicorn's own handling, unchanged.
"""

from __future__ import annotations

import select
import threading
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

LINGER = 0.005  # seconds a thread waits for its connection's next request


class Worker(ThreadWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._busy = 0  # the pool's threads serving a connection now
        self._busy_lock = threading.Lock()

    def _count(self, change: int) -> None:
        with self._busy_lock:
            self._busy += change

    def handle(self, conn: Any) -> Any:  # noqa: ANN401 - gunicorn's TConn and its result
        self._count(1)
        try:
            result = super().handle(conn)
            while result is True and self.lingers():
                if not conn.parser.unreader.buf.getvalue() and not self.arrives(conn):
                    break  # nothing read ahead already, and nothing came in time
                self.log.debug("the next request of %s on the thread that answered", conn.client)
                result = super().handle(conn)
            return result
        finally:
            self._count(-1)

    @staticmethod
    def arrives(conn: Any) -> bool:  # noqa: ANN401 - gunicorn's TConn
        """Whether the connection's next bytes (or its close) arrive within LINGER: poll,
        not select, whose descriptors stop at 1024 where a busy worker's may not."""
        poller = select.poll()
        try:
            poller.register(conn.sock, select.POLLIN)
            return bool(poller.poll(LINGER * 1000))
        except (OSError, ValueError):  # closed meanwhile
            return False

    def lingers(self) -> bool:
        """Whether a thread that answered may wait for its connection's next request: the
        worker is not stopping and at most a quarter of its threads are serving (this one
        too)."""
        return self.alive and self._busy <= self.cfg.threads // 4
