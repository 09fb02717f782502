"""The per-machine fleet supervisor: `laneway fleet` (workers) and `laneway up` (web, beat
and workers).

It keeps the processes that must always run up (cpu workers, web, beat), restarting one
that dies, and it scales the gpu lane from zero: when the gpu lane's depth (queued +
reserved + running) is above zero, it starts workers on free devices, as many as the depth
(one per device at most), so a running chunk never makes it start a worker with nothing
to do. Beat scales the
lane back to zero (tasks/scaling.py): idle gpu workers shut down warm and are not started
again until gpu work waits. Every start and exit is recorded in Postgres.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fleet import devicelock
from fleet.lifeline import die_with_parent

log = logging.getLogger("fleet.supervisor")

ALWAYS = "always"  # kept running: restarted when it exits
UNTIL_STOPPED = "until_stopped"  # restarted when it crashes; a clean exit (asked to) is final
ON_DEMAND = "on_demand"  # started while its lane has work waiting (gpu workers)
RESTARTS_ALLOWED = 5  # in RESTART_WINDOW seconds; past that a child is given up
RESTART_WINDOW = 60.0


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    policy: str = ALWAYS
    node: str | None = None  # the Celery node name of a worker (`gpu0@host`)
    proc: subprocess.Popen | None = None
    instance: str | None = None
    exits: deque = field(default_factory=lambda: deque(maxlen=RESTARTS_ALLOWED + 1))
    failed: int | None = None  # the exit code it was given up with
    lock: Path | None = None  # a gpu worker's device lock (fleet/devicelock.py)
    blocked: bool = False  # not started: another process holds its device

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _record(child: Child, kind: str, reason: str, **detail: object) -> None:
    """A worker event in Postgres; the fleet goes on should the database be away."""
    if child.node is None or child.instance is None:
        return
    try:
        from workers.registry import record_event

        record_event(child.instance, child.node, kind, reason, **detail)
    except Exception as exc:  # noqa: BLE001 - bookkeeping never stops the fleet
        log.warning("could not record %s of %s: %s", kind, child.name, type(exc).__name__)


@dataclass
class Fleet:
    """Child processes supervised together; SIGTERM stops them warm, in reverse order."""

    stop_timeout: float = 60.0
    log_dir: Path | None = None  # None: children write to this process's stdout/stderr
    children: dict[str, Child] = field(default_factory=dict)
    # Reads the gpu lane's depth; None: no on-demand children are started.
    gpu_depth: Callable[[], int] | None = None
    on_step: Callable[[Fleet], None] | None = None
    # Called once the children have stopped (the fleet withdraws what it told others).
    on_stop: Callable[[Fleet], None] | None = None

    # --- children ----------------------------------------------------------------------

    def add(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        policy: str = ALWAYS,
        node: str | None = None,
        lock: Path | None = None,
    ) -> Child:
        child = Child(name, list(argv), dict(env or {}), policy, node, lock=lock)
        self.children[name] = child
        return child

    def start(
        self,
        name: str,
        argv: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        reason: str = "fleet start",
        waiting_since: float | None = None,
    ) -> Child:
        """Start a child (adding it first when argv is given); a child whose device another
        process holds is left `blocked`, and started by a later step once the device is free."""
        if argv is not None:
            self.add(name, argv, env)
        child = self.children[name]
        lock_fd = None
        if child.lock is not None:
            lock_fd = devicelock.take(child.lock)
            if lock_fd is None:
                if not child.blocked:
                    log.warning(
                        "%s not started: its device is held by pid %s (%s); waiting for it",
                        name, devicelock.holder(child.lock), child.lock,
                    )  # fmt: skip
                child.blocked = True
                return child
            child.blocked = False
        extra: dict[str, str] = {}
        if child.node is not None:
            from workers.registry import (
                ENV_INSTANCE,
                ENV_START_REASON,
                ENV_WAITING_SINCE,
                make_instance_id,
            )

            child.instance = make_instance_id(child.node)
            extra = {ENV_INSTANCE: child.instance, ENV_START_REASON: reason}
            if waiting_since is not None:
                extra[ENV_WAITING_SINCE] = _iso(waiting_since)
        out = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        # Each child gets its own process group, so Ctrl-C reaches only the supervisor,
        # which then stops every child in order; it dies with the supervisor, should that
        # be killed; it holds its device's lock from before its start to its end.
        try:
            child.proc = subprocess.Popen(
                child.argv,
                env={**os.environ, **child.env, **extra},
                start_new_session=True,
                stdout=out,
                stderr=out,
                pass_fds=() if lock_fd is None else (lock_fd,),
                preexec_fn=die_with_parent(),  # noqa: PLW1509 - started from the main thread
            )
            if lock_fd is not None:
                devicelock.record_holder(lock_fd, child.proc.pid)
        finally:
            if out is not None:
                out.close()
            if lock_fd is not None:
                os.close(lock_fd)  # the child's copy keeps the lock
        log.info("started %s (pid %s): %s", name, child.proc.pid, reason)
        _record(child, "start", reason, pid=child.proc.pid)
        return child

    def start_always(self) -> None:
        """Start every child that is not started on demand."""
        for name, child in self.children.items():
            if child.policy != ON_DEMAND and not child.running:
                self.start(name, reason="fleet start")

    def finished(self) -> bool:
        """True when nothing runs and nothing will start again by itself."""
        return not any(
            c.running
            or c.blocked
            or (c.policy == ALWAYS and c.failed is None)
            or c.policy == ON_DEMAND
            for c in self.children.values()
        )

    def dead(self) -> list[tuple[str, int]]:
        """Children given up: they kept exiting (RESTARTS_ALLOWED in RESTART_WINDOW)."""
        return [(c.name, c.failed) for c in self.children.values() if c.failed is not None]

    # --- supervision -------------------------------------------------------------------

    def _gave_up(self, child: Child, now: float, code: int | None) -> bool:
        """Count an exit; True (and the child given up) past RESTARTS_ALLOWED in the window."""
        child.exits.append(now)
        if sum(1 for t in child.exits if now - t <= RESTART_WINDOW) > RESTARTS_ALLOWED:
            log.error("%s keeps exiting (code %s); giving up on it", child.name, code)
            child.failed = code if code is not None else -1
            return True
        return False

    def _reap(self, now: float) -> None:
        for child in self.children.values():
            if child.proc is None or child.proc.poll() is None:
                continue
            code = child.proc.returncode
            child.proc = None
            _record(child, "exit", f"exited with code {code}", code=code)
            if child.policy == ON_DEMAND or (child.policy == UNTIL_STOPPED and code == 0):
                # A gpu worker stopped by beat exits 0; one that crashed counts toward
                # giving up, so a broken device is not started again and again.
                log.info("%s exited (code %s)", child.name, code)
                if code != 0 and child.policy == ON_DEMAND:
                    self._gave_up(child, now, code)
                continue
            if not self._gave_up(child, now, code):
                log.warning("%s exited with code %s; restarting it", child.name, code)
                self.start(child.name, reason=f"restart after exit code {code}")

    def _scale_up(self) -> None:
        """Start gpu workers for the work in the gpu lane: as many as its depth (queued +
        reserved + running), up to one per device. From zero, any depth starts one."""
        demand = [c for c in self.children.values() if c.policy == ON_DEMAND and c.failed is None]
        idle = [c for c in demand if not c.running]
        if not idle or self.gpu_depth is None:
            return
        try:
            depth = self.gpu_depth()
        except Exception as exc:  # noqa: BLE001 - Redis away: look again next step
            log.warning("cannot read the gpu lane's depth: %s", type(exc).__name__)
            return
        wanted = min(len(demand), depth) - (len(demand) - len(idle))
        waiting_since = time.time()
        for child in idle[: max(0, wanted)]:
            self.start(
                child.name,
                reason=f"gpu work waiting (depth {depth})",
                waiting_since=waiting_since,
            )

    def _start_unblocked(self) -> None:
        """Start the kept-up children that waited for their device (on-demand ones are
        started again by _scale_up)."""
        for child in self.children.values():
            if child.blocked and child.policy != ON_DEMAND and not child.running:
                self.start(child.name, reason="its device is free")

    def step(self) -> None:
        now = time.monotonic()
        self._reap(now)
        self._start_unblocked()
        self._scale_up()
        if self.on_step is not None:
            self.on_step(self)

    def supervise_in_background(self, poll: float = 0.5) -> None:
        """Step in a thread (for `laneway demo`, which waits on a job meanwhile)."""
        self._halt = threading.Event()

        def loop() -> None:
            while not self._halt.wait(poll):
                self.step()

        self._thread = threading.Thread(target=loop, name="laneway-fleet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if getattr(self, "_thread", None) is not None:
            self._halt.set()
            self._thread.join()
            self._thread = None
        running = [c for c in self.children.values() if c.running]
        for child in reversed(running):
            log.info("stopping %s (pid %s)", child.name, child.proc.pid)
            child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for child in running:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time; killing it", child.name)
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
            _record(child, "exit", "fleet stopped", code=child.proc.returncode)
        if self.on_stop is not None:
            self.on_stop(self)

    def run_until_signal(self, poll: float = 0.5) -> int:
        """Supervise until SIGINT/SIGTERM, then stop everything; 1 if a child was given up."""
        stopping = False

        def _stop(signum: int, _frame: object) -> None:
            nonlocal stopping
            stopping = True

        old = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not stopping and not self.finished():
                self.step()
                time.sleep(poll)
            self.stop()
            return 1 if self.dead() else 0
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


def _iso(moment: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(moment, UTC).isoformat()


def hostname() -> str:
    return socket.gethostname()
