"""Start and stop the processes of a one-machine fleet: web, a worker per queue, beat."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("laneway.fleet")


@dataclass
class Fleet:
    """Child processes started together and stopped together (SIGTERM: warm shutdown)."""

    stop_timeout: float = 60.0
    log_dir: Path | None = None  # None: children write to this process's stdout/stderr
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        full_env = {**os.environ, **(env or {})}
        out = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        # Each child gets its own process group, so Ctrl-C reaches only the supervisor,
        # which then stops every child in order.
        self.procs[name] = subprocess.Popen(
            list(argv), env=full_env, start_new_session=True, stdout=out, stderr=out
        )
        if out is not None:
            out.close()
        log.info("started %s (pid %s): %s", name, self.procs[name].pid, " ".join(argv))

    def dead(self) -> list[tuple[str, int]]:
        return [(n, p.returncode) for n, p in self.procs.items() if p.poll() is not None]

    def stop(self) -> None:
        for name, proc in reversed(list(self.procs.items())):
            if proc.poll() is None:
                log.info("stopping %s (pid %s)", name, proc.pid)
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time; killing it", name)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def run_until_signal(self) -> int:
        """Block until SIGINT/SIGTERM or a child's death, then stop everything."""
        stopping = False

        def _stop(signum: int, _frame: object) -> None:
            nonlocal stopping
            stopping = True

        old = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not stopping:
                dead = self.dead()
                if dead:
                    for name, code in dead:
                        log.error("%s exited with code %s; stopping the fleet", name, code)
                    self.stop()
                    return 1
                time.sleep(0.2)
            self.stop()
            return 0
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
