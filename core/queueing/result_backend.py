"""The result backend: Celery's Redis backend, minus the subscriptions made while sending.

Stock Celery subscribes the sending process to each sent task's result channel (and, in
`apply_chord`, to every header task's), holding the result objects until they complete so
that a later `.get()` is fast. Laneway's senders (web, CLI, beat) never wait on results:
Postgres is the source of truth. In a web process those subscriptions would only pile up,
so `fire_and_forget()` sends without subscribing; `.get()` elsewhere works as usual.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.backends.redis import RedisBackend

_state = threading.local()


@contextmanager
def fire_and_forget() -> Iterator[None]:
    """Send tasks inside this block without subscribing to their results."""
    _state.active = True
    try:
        yield
    finally:
        _state.active = False


def _active() -> bool:
    return getattr(_state, "active", False)


class FireAndForgetRedisBackend(RedisBackend):
    def on_task_call(self, producer: Any, task_id: str) -> None:
        if not _active():
            super().on_task_call(producer, task_id)

    def add_pending_result(self, result: Any, weak: bool = False, start_drainer: bool = True):  # noqa: ANN201
        if _active():
            return result
        return super().add_pending_result(result, weak=weak, start_drainer=start_drainer)


def backend_url(redis_url: str) -> str:
    """The `module:Class+url` spelling Celery resolves to the backend above."""
    name = f"{__name__}:{FireAndForgetRedisBackend.__name__}"
    if redis_url.startswith("redis+socket://"):
        return f"{name}+socket://{redis_url[len('redis+socket://') :]}"
    return f"{name}+{redis_url}"
