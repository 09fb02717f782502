"""gunicorn's access log, written off the request's thread (`laneway web`'s logger class).

gunicorn writes each access line in the thread that served the request: it builds an atom
for every request and response header and every WSGI environ entry, formats the line, and
writes and flushes it under the log handler's lock, which a web process's threads take
in turn. Here a request only appends the fields the line needs to a queue; one thread per
process formats each line as gunicorn would (the same format, its quote escaping, the
same handlers, so redaction and log shipping see the same lines) and writes those waiting
in one record: a write and a flush for them all, redacted as one text. Lines wait at most
FLUSH_EVERY seconds; a worker drains its queue as it exits (webapp/gunicorn_hooks.py), and
a killed one loses at most those.

A format naming a header or an environ atom (`%({name}i)s` ...) needs what a request no
longer carries: with one, each line is written as gunicorn writes it.
"""

from __future__ import annotations

import collections
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from gunicorn import glogging

from core.util import process

FLUSH_EVERY = 0.05  # seconds a line may wait for the writer
# The environ entries gunicorn's atoms read (HTTP_AUTHORIZATION: the `u` atom's user).
ENVIRON = ("REMOTE_ADDR", "REQUEST_METHOD", "RAW_URI", "SERVER_PROTOCOL", "PATH_INFO",
           "QUERY_STRING", "HTTP_REFERER", "HTTP_USER_AGENT", "HTTP_AUTHORIZATION")  # fmt: skip


class AccessLogger(glogging.Logger):
    def __init__(self, cfg: Any) -> None:
        self._pending: collections.deque[tuple[Any, ...]] = collections.deque()
        self._writer_pid = 0  # the process whose writer thread runs
        self._lock = threading.Lock()
        self._draining = threading.Lock()
        self._names: dict[str, tuple[str, ...]] = {}  # per format, the atoms it names
        self._stamp: tuple[int, str] = (-1, "")
        super().__init__(cfg)

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        if not self.access_log_enabled:
            return
        if "{" in self.cfg.access_log_format:  # header or environ atoms: gunicorn's own way
            super().access(resp, req, environ, request_time)
            return
        kept = {name: environ[name] for name in ENVIRON if name in environ}
        self._pending.append(
            (resp.status, getattr(resp, "sent", None), kept, request_time, time.time())
        )
        if self._writer_pid != process.pid():  # the first request of this (forked) worker
            self._start_writer()

    def _start_writer(self) -> None:
        with self._lock:
            if self._writer_pid == process.pid():
                return
            self._writer_pid = process.pid()
            threading.Thread(target=self._write_forever, daemon=True).start()

    def _write_forever(self) -> None:
        while True:
            time.sleep(FLUSH_EVERY)
            self.drain()

    def drain(self) -> None:
        """Write every line waiting, in the order the requests ended (one drainer at a
        time: a worker's exit drains beside its writer thread)."""
        with self._draining:
            self._write_pending()

    def _write_pending(self) -> None:
        lines = []
        while self._pending:
            try:
                lines.append(self.cfg.access_log_format % self.line_atoms(*self._pending.popleft()))
            except Exception:  # noqa: BLE001 - as gunicorn's access(): report, go on
                self.exception("could not format an access line")
        if lines:
            # One record, one write and flush, for the lines waiting: a record per line
            # cost the writer as much as the requests saved.
            self.access_log.info("%s", "\n".join(lines))

    def line_atoms(
        self, status: Any, sent: Any, environ: dict[str, Any], request_time: Any, at: float
    ) -> dict[str, Any]:
        """The atoms the format names, each as gunicorn's Logger.atoms and SafeAtoms make it
        (a string's quotes escaped; '-' for a name gunicorn does not know), from what the
        request left, with the time the request ended rather than the time the line is
        written. Only those: gunicorn's makes every atom, and a copy of them, per line."""
        form = self.cfg.access_log_format
        names = self._names.get(form)
        if names is None:
            names = self._names[form] = tuple(dict.fromkeys(ATOM_NAME.findall(form)))
        atoms = _Atoms()
        for name in names:
            make = ATOMS.get(name)
            if make is not None:
                value = make(self, status, sent, environ, request_time, at)
                atoms[name] = value.replace('"', '\\"') if isinstance(value, str) else value
        return atoms

    def stamp(self, at: float) -> str:
        """The `t` atom of a line that ended at `at` (made once per second: lines come by
        the hundred)."""
        second = int(at)
        if second != self._stamp[0]:
            self._stamp = (second, time.strftime("[%d/%b/%Y:%H:%M:%S %z]", time.localtime(at)))
        return self._stamp[1]


class _Atoms(dict):
    """A line's atoms: '-' for a name it lacks, as gunicorn's SafeAtoms answers."""

    def __missing__(self, name: str) -> str:
        return "-"


def _status(status: Any) -> Any:
    return status.split(None, 1)[0] if isinstance(status, str) else status


# Each atom as gunicorn's Logger.atoms makes it (gunicorn 23-27), from (logger, status, sent,
# environ, request_time, end time); tests/unit/test_accesslog.py sets every line beside
# gunicorn's own logger's.
ATOMS: dict[str, Callable[..., Any]] = {
    "h": lambda lg, st, sent, env, took, at: env.get("REMOTE_ADDR", "-"),
    "l": lambda lg, st, sent, env, took, at: "-",
    "u": lambda lg, st, sent, env, took, at: lg._get_user(env) or "-",
    "t": lambda lg, st, sent, env, took, at: lg.stamp(at),
    "r": lambda lg, st, sent, env, took, at: (
        f"{env['REQUEST_METHOD']} {env['RAW_URI']} {env['SERVER_PROTOCOL']}"
    ),
    "s": lambda lg, st, sent, env, took, at: _status(st),
    "m": lambda lg, st, sent, env, took, at: env.get("REQUEST_METHOD"),
    "U": lambda lg, st, sent, env, took, at: env.get("PATH_INFO"),
    "q": lambda lg, st, sent, env, took, at: env.get("QUERY_STRING"),
    "H": lambda lg, st, sent, env, took, at: env.get("SERVER_PROTOCOL"),
    "b": lambda lg, st, sent, env, took, at: sent is not None and str(sent) or "-",
    "B": lambda lg, st, sent, env, took, at: sent,
    "f": lambda lg, st, sent, env, took, at: env.get("HTTP_REFERER", "-"),
    "a": lambda lg, st, sent, env, took, at: env.get("HTTP_USER_AGENT", "-"),
    "T": lambda lg, st, sent, env, took, at: took.seconds,
    "D": lambda lg, st, sent, env, took, at: took.seconds * 1000000 + took.microseconds,
    "M": lambda lg, st, sent, env, took, at: took.seconds * 1000 + int(took.microseconds / 1000),
    "L": lambda lg, st, sent, env, took, at: f"{took.seconds:d}.{took.microseconds:06d}",
    "p": lambda lg, st, sent, env, took, at: f"<{process.pid()}>",
}
ATOM_NAME = re.compile(r"%\((\w+)\)")
