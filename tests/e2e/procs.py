"""Start and stop real processes (web app, celery workers) for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent
# Generous: on a 2-core machine a web worker's first request may wait behind model loads.
http = httpx.Client(timeout=60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Every process a test started, so that none outlives its test (tests/e2e/conftest.py
# stops those a test left running, whatever failed before its own cleanup could run).
STARTED: list[Proc] = []


class Proc:
    """A child process whose output goes to a log file, shown when a test fails."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        logdir: Path,
        env: dict[str, str] | None = None,
        inherit_env: bool = True,
    ):
        self.name = name
        self.log = logdir / f"{name}.log"
        self.proc = subprocess.Popen(
            argv,
            stdout=open(self.log, "wb"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
            env={**(os.environ if inherit_env else {}), **(env or {})},
            start_new_session=True,
        )
        STARTED.append(self)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 40) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def stop(self, timeout: float = 30) -> int:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        else:
            # The leader is gone; a process it left in its group must go too. (`laneway`'s
            # own child, in a session of its own, died with it: fleet/lifeline.py.)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return self.proc.returncode


def stop_started_since(count: int) -> None:
    """Stop every process started after the first `count` (newest first)."""
    for proc in reversed(STARTED[count:]):
        proc.stop()
    del STARTED[count:]


@contextmanager
def all_or_none() -> Iterator[None]:
    """Processes started together: those started inside are stopped if anything inside
    fails (a fixture's own teardown never runs then)."""
    count = len(STARTED)
    try:
        yield
    except BaseException:
        stop_started_since(count)
        raise


def wait_for(
    predicate: Callable[[], object],
    timeout: float,
    what: str,
    procs=(),
    report: Callable[[], str] | None = None,
) -> object:
    """Poll until predicate() is truthy; fail early, with logs, if a process died.
    `report` adds what the database or broker looked like to a timeout's message."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if not p.alive():
                raise AssertionError(f"{p.name} exited ({p.proc.returncode}):\n{p.tail()}")
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    logs = "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)
    state = f"\n--- state\n{report()}" if report else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}{state}\n{logs}")


def start_web(logdir: Path, env: dict[str, str] | None = None) -> tuple[Proc, str]:
    port = free_port()
    proc = Proc("web", [str(BIN / "laneway"), "web", "--port", str(port)], logdir, env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, [proc])
    except BaseException:
        proc.stop()
        raise
    return proc, url


def wait_healthy(url: str, procs, timeout: float = 90) -> None:
    def healthy() -> bool:
        try:
            return http.get(f"{url}/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(healthy, timeout, f"{url}/healthz to answer 200", procs)


def start_worker(
    name: str,
    argv: list[str],
    logdir: Path,
    env=None,
    models: bool = True,
    log_name=None,
    wait: bool = True,
) -> Proc:
    """Start a worker and wait until it answers a ping (and, if it runs models, has loaded
    them). `name` is its node name before @host; `log_name` tells its log apart. Without
    `wait`, `wait_ready` waits for it, so that processes started together load side by side."""
    proc = Proc(log_name or name, argv, logdir, env)
    if wait:
        wait_ready({proc: name}, models)
    return proc


def wait_ready(workers: dict[Proc, str], models: bool = True) -> None:
    """Wait until every worker (each with its node name before @host) is ready as
    `start_worker` waits for one; stop them all when one is not."""
    host = socket.gethostname()
    checks = [worker_ready(proc, f"{name}@{host}", models) for proc, name in workers.items()]
    try:
        wait_for(lambda: all(check() for check in checks), 120,
                 f"worker {', '.join(workers.values())}", list(workers))  # fmt: skip
    except BaseException:
        for proc in workers:
            proc.stop()
        raise


def worker_ready(proc: Proc, node: str, models: bool = True) -> Callable[[], bool]:
    """True once the worker `node` answers a ping (and, if it runs models, has loaded them).
    The ping goes through the broker the worker inherited (LANEWAY_BROKER_URL: a test on
    RabbitMQ sets it), else the Redis of the run's app."""
    from celery import Celery

    from tasks import app

    broker = os.environ.get("LANEWAY_BROKER_URL")
    if broker:  # control's producers come from the app's own pool: an app of that broker
        app = Celery("ping", broker=broker, set_as_current=False)

    def ready() -> bool:
        replies = app.control.ping(destination=[node], timeout=0.5)
        loaded = not models or "loaded in pid" in proc.log.read_text()
        return any(node in r for r in replies) and loaded

    return ready


@contextmanager
def interactive_worker(settings, logdir: Path, name: str, env=None) -> Iterator[Proc]:
    """One `laneway worker interactive` on the run's Redis (earlier tests' messages that
    nobody waits for emptied first), stopped afterwards."""
    from tests.broker import empty_queues

    empty_queues(settings)
    argv = [str(BIN / "laneway"), "worker", "interactive", "--name", name]
    proc = start_worker(name, argv, logdir, env=env)
    try:
        yield proc
    finally:
        proc.stop()
