"""gunicorn's hooks for `laneway web` (`--config python:webapp.gunicorn_hooks`)."""

from __future__ import annotations

from typing import Any

from core.config.startup import freeze_startup_objects


def post_worker_init(worker: Any) -> None:  # noqa: ARG001 - gunicorn's signature
    """Once a worker has built the app: its start-up objects leave the collector's walks
    (core/config/startup.py)."""
    freeze_startup_objects()
