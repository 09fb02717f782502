"""Each worker process records itself in Postgres and beats a heartbeat there.

The reconciler trusts a chunk's "running" state only while the worker process running it
keeps beating: a killed worker (SIGKILL, a lost host) stops beating, and its chunk goes
back to its lane within `Settings.worker_dead_after` seconds instead of waiting for the
broker's visibility timeout. Identity is per process start (`instance_id`), not per node
name, so a worker restarted under the same name does not vouch for its dead predecessor.

Pool processes count the chunk tasks running (beat stops gpu workers idle too long) and
record idle periods; a worker started because work waited records its cold start: from
the moment the fleet saw the work waiting to the end of its first chunk task.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from core.config.settings import Settings, get_settings
from core.vocab import GPU_QUEUES
from db.common import aware, utcnow
from db.models import Worker, WorkerEvent
from db.session import session_scope

log = logging.getLogger(__name__)
# Set by whoever starts the worker (the fleet), read by the worker and its pool children.
ENV_INSTANCE = "LANEWAY_WORKER_INSTANCE"
ENV_START_REASON = "LANEWAY_START_REASON"
ENV_WAITING_SINCE = "LANEWAY_WORK_WAITING_SINCE"
# The stop reason of a worker the reconciler found silent (not a stop it announced).
HEARTBEAT_LOST = "heartbeat lost"
# Idle periods shorter than this (the gap between two chunks) are not worth a row.
MIN_IDLE_RECORDED = 1.0
# Tasks or requests running now, and since when there have been some (or none).
Activity = tuple[int, datetime]

_state: dict[str, Any] = {}


def make_instance_id(hostname: str) -> str:
    return f"{hostname}/{uuid.uuid4().hex[:12]}"


def new_instance_id(hostname: str) -> str:
    """The id the fleet chose for this process, or a new one. Set in the worker's parent
    before its pool forks, so children inherit it."""
    instance = os.environ.get(ENV_INSTANCE) or make_instance_id(hostname)
    os.environ[ENV_INSTANCE] = instance
    return instance


def instance_id() -> str:
    """This worker's instance id (its parent's, in a pool child); a stand-in elsewhere."""
    return os.environ.get(ENV_INSTANCE) or f"{socket.gethostname()}/{os.getpid()}/local"


def _waiting_since() -> datetime | None:
    raw = os.environ.get(ENV_WAITING_SINCE)
    try:
        return datetime.fromisoformat(raw) if raw else None
    except ValueError:
        return None


def register(instance: str, hostname: str, queues: Sequence[str], device: str | None) -> None:
    now = utcnow()
    pinned = GPU_QUEUES & set(queues)
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES") if pinned else None
    with session_scope() as session:
        session.merge(
            Worker(
                id=instance,
                hostname=hostname,
                queues=sorted(queues),
                device=device,
                gpu_device=gpu,
                pid=os.getpid(),
                started_at=now,
                last_seen_at=now,
                idle_since=now,
                running_tasks=0,
                start_reason=(os.environ.get(ENV_START_REASON) or "started by hand")[:200],
                waiting_since=_waiting_since(),
            )
        )


def ready(instance: str) -> None:
    """A pool process finished loading its models: idle time counts from now, not from
    the start of a worker that could not run anything yet."""
    with session_scope() as session:
        session.execute(
            update(Worker)
            .where(Worker.id == instance, Worker.running_tasks == 0)
            .values(idle_since=utcnow())
        )


@contextmanager
def _locked_row(instance: str) -> Iterator[tuple[Session, Worker | None]]:
    """The worker's row, locked until the transaction commits (None once it is gone)."""
    with session_scope() as session:
        yield session, session.get(Worker, instance, with_for_update=True)


def task_started(instance: str) -> None:
    """A chunk task starts in a pool process: count it, and close the idle period."""
    now = utcnow()
    with _locked_row(instance) as (session, worker):
        if worker is None:
            return
        idle_since = aware(worker.idle_since)
        if worker.running_tasks == 0 and idle_since is not None:
            idle = (now - idle_since).total_seconds()
            if idle >= MIN_IDLE_RECORDED:
                session.add(
                    WorkerEvent(
                        worker_id=instance,
                        hostname=worker.hostname,
                        kind="idle",
                        detail={"from": idle_since.isoformat(), "seconds": round(idle, 3)},
                    )
                )
        if worker.running_tasks == 0:
            worker.busy_since = now
        worker.running_tasks += 1


def task_finished(instance: str) -> None:
    """A chunk task ended: count it down; the first one ends a scale-up's cold start."""
    now = utcnow()
    with _locked_row(instance) as (_, worker):
        if worker is None:
            return
        worker.running_tasks = max(0, worker.running_tasks - 1)
        if worker.running_tasks == 0:
            worker.idle_since = now
        if worker.first_task_at is None:
            worker.first_task_at = now
            waiting = aware(worker.waiting_since)
            if waiting is not None:
                worker.cold_start_seconds = round((now - waiting).total_seconds(), 3)


class TaskCounts:
    """A pool process's chunk task starts and ends, recorded in order (`record(instance,
    started)`). One that fails (Postgres away) waits, with every one after it, for a
    thread that records them once Postgres answers again: an end lost for good would leave
    the worker counted busy, and beat would never stop it when idle."""

    def __init__(self, record: Callable[[str, bool], None], retry_every: float = 2.0) -> None:
        self._record = record
        self._retry_every = retry_every
        self._pending: deque[tuple[str, bool]] = deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()  # a retry now, not after retry_every (tests)

    def add(self, instance: str, started: bool) -> None:
        """Record now, unless earlier ones wait: then after them, by the thread. Called by
        the pool process's one task thread; Postgres is never asked under the lock, so a
        task's start or end never waits on the thread's retry."""
        with self._lock:
            waiting = bool(self._pending)
            if waiting:
                self._pending.append((instance, started))
        if waiting:
            return
        try:
            self._record(instance, started)
            return
        except Exception as exc:  # noqa: BLE001 - bookkeeping must never fail a chunk
            log.warning(
                "could not record a chunk task's %s (%s): recording it once Postgres "
                "answers", "start" if started else "end", type(exc).__name__,
            )  # fmt: skip
        with self._lock:
            self._pending.append((instance, started))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._drain, name="laneway-task-counts", daemon=True
                )
                self._thread.start()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _drain(self) -> None:
        """Record the waiting ones, oldest first, each taken off only once recorded; end
        once none waits (under the lock: `add` then records directly again)."""
        while True:
            self._wake.wait(self._retry_every)
            self._wake.clear()
            while True:
                with self._lock:
                    if not self._pending:
                        self._thread = None  # under the lock: the next failure starts one
                        return
                    instance, started = self._pending[0]
                try:
                    self._record(instance, started)
                except Exception:  # noqa: BLE001 - still away: try again later
                    break
                with self._lock:
                    self._pending.popleft()


def record_chunk_task(instance: str, started: bool) -> None:
    (task_started if started else task_finished)(instance)


def beat(instance: str, activity: Activity | None = None) -> None:
    """The heartbeat; with `activity` (requests in flight and since when there have been
    some or none), also the worker's busy or idle state. A worker the reconciler gave up
    on (its link was cut, its host froze) that beats again is alive: without this its
    later chunks would look orphaned and be sent again (harmless to results, but every
    one computed twice)."""
    values: dict[str, Any] = {"last_seen_at": utcnow()}
    if activity is not None:
        running, since = activity
        values["running_tasks"] = running
        values["busy_since" if running else "idle_since"] = since
    with session_scope() as session:
        found = session.execute(
            update(Worker)
            .where(Worker.id == instance)
            .values(**values)
            .returning(Worker.stop_reason, Worker.hostname)
        ).first()
        revived = found is not None and found.stop_reason == HEARTBEAT_LOST
        if revived:
            session.execute(
                update(Worker)
                .where(Worker.id == instance)
                .values(stopped_at=None, stop_reason=None)
            )
            session.add(WorkerEvent(worker_id=instance, hostname=found.hostname, kind="revived"))
    if revived:
        log.warning("worker %s beats again after its heartbeat was declared lost", instance)


def stopped(instance: str, reason: str) -> None:
    with session_scope() as session:
        session.execute(
            update(Worker)
            .where(Worker.id == instance, Worker.stopped_at.is_(None))
            .values(stopped_at=utcnow(), stop_reason=reason[:200])
        )


def record_event(
    instance: str, hostname: str, kind: str, reason: str | None = None, **detail: Any
) -> None:
    """A worker event (start, exit, scale_down) from whoever caused or saw it."""
    with session_scope() as session:
        session.add(
            WorkerEvent(
                worker_id=instance,
                hostname=hostname,
                kind=kind,
                reason=reason[:200] if reason else None,
                detail=detail or None,
            )
        )


def start_heartbeat(
    instance: str,
    hostname: str,
    queues: Sequence[str],
    device: str | None,
    settings: Settings | None = None,
    activity: Callable[[], Activity | None] | None = None,
) -> threading.Event:
    """Register the worker and beat every `worker_heartbeat` seconds until the event is set.

    A worker that runs no chunk task (the interactive one) passes `activity`: each beat
    also writes whether it is busy and since when, so its state costs no write per request.
    Database outages are logged and ridden out: the thread keeps trying, and the reconciler
    (which needs the same database) cannot act on a missed beat meanwhile anyway.
    """
    settings = settings or get_settings()
    stop = threading.Event()

    def loop() -> None:
        registered = False
        while not stop.is_set():
            try:
                if not registered:
                    register(instance, hostname, queues, device)
                    registered = True
                else:
                    beat(instance, activity() if activity is not None else None)
            except Exception as exc:  # noqa: BLE001 - never let the heartbeat thread die
                log.warning("worker heartbeat failed: %s", type(exc).__name__)
            stop.wait(settings.worker_heartbeat)

    thread = threading.Thread(target=loop, name="laneway-heartbeat", daemon=True)
    thread.start()
    _state.update(instance=instance, stop=stop, thread=thread)
    return stop


def stop_heartbeat(reason: str = "shutdown") -> None:
    """Stop beating and record the stop (a warm shutdown; a killed worker never gets here)."""
    stop = _state.pop("stop", None)
    if stop is None:
        return
    stop.set()
    thread = _state.pop("thread", None)
    if thread is not None:
        thread.join(timeout=5)
    try:
        stopped(_state.pop("instance"), reason)
    except Exception as exc:  # noqa: BLE001 - shutting down regardless
        log.warning("could not record the worker's stop: %s", type(exc).__name__)
