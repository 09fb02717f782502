"""What every Laneway task declares about reliability, in one place.

Messages are acknowledged after the task ends (`acks_late`), and given back to the queue
when the worker process running them dies (`reject_on_worker_lost`), so a crash never
loses one; results are upserted, so running a task twice is harmless. Transient errors
(the database or the broker dropping a connection) are retried with exponential backoff
and jitter; anything else fails the task.
"""

from __future__ import annotations

import kombu.exceptions
import redis.exceptions
import sqlalchemy.exc
from celery import Task

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    sqlalchemy.exc.OperationalError,  # connection refused, server restarted, terminated
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.DisconnectionError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    kombu.exceptions.OperationalError,
    ConnectionError,
)


class LanewayTask(Task):
    acks_late = True
    reject_on_worker_lost = True
    autoretry_for = TRANSIENT_ERRORS
    max_retries = 8
    retry_backoff = 1  # seconds: 1, 2, 4, ... with jitter
    retry_backoff_max = 60
    retry_jitter = True


def chunk_time_limits(chunk_timeout: int) -> dict[str, int]:
    """Hard limit `LANEWAY_CHUNK_TIMEOUT`; the soft limit comes first, leaving the chunk
    time to record its items as failed before the hard limit kills the process."""
    soft = max(1, chunk_timeout - max(1, chunk_timeout // 10))
    return {"time_limit": chunk_timeout, "soft_time_limit": soft}


def visibility_timeout(chunk_timeout: int) -> int:
    """Redis redelivers an unacknowledged message after this many seconds. A chunk retried
    with a countdown (60 s at most) is held beside the chunk its worker runs, waits for it,
    then runs: the timeout must exceed two hard limits and the countdown, or running
    chunks would be delivered twice."""
    return 2 * chunk_timeout + 60
