"""gunicorn's hooks for `laneway web` (`--config python:webapp.gunicorn_hooks`)."""

from __future__ import annotations

from typing import Any

from laneway.startup import freeze_startup_objects


def post_worker_init(worker: Any) -> None:  # noqa: ARG001 - gunicorn's signature
    """Once a worker has built the app: its start-up objects leave the collector's walks
    (laneway/startup.py)."""
    freeze_startup_objects()
