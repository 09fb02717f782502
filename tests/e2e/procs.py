"""Start and stop real processes (web app, celery workers) for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        return self.proc.returncode


def wait_for(predicate: Callable[[], object], timeout: float, what: str, procs=()) -> object:
    """Poll until predicate() is truthy; fail early, with logs, if a process died."""
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
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{logs}")


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
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(healthy, timeout, f"{url}/healthz to answer 200", procs)


def start_worker(name: str, argv: list[str], logdir: Path, env=None) -> Proc:
    """Start a worker and wait until its model is loaded and it answers a ping."""
    from tasks import app

    proc = Proc(name, argv, logdir, env)
    node = f"{name}@{socket.gethostname()}"

    def ready() -> bool:
        replies = app.control.ping(destination=[node], timeout=0.5)
        return any(node in r for r in replies) and "loaded in pid" in proc.log.read_text()

    try:
        wait_for(ready, 120, f"worker {node}", [proc])
    except BaseException:
        proc.stop()
        raise
    return proc
