"""gunicorn's hooks and logger for `laneway web` (`--config python:webapp.gunicorn_hooks`)."""

from __future__ import annotations

from typing import Any

from core.config.startup import freeze_startup_objects
from db.session import session_factory


def post_worker_init(worker: Any) -> None:
    """Once a worker has built the app: its database engine is made (the driver imported)
    before the first request, rather than by the first requests while the others wait on
    the import (a new web process under load spent its first seconds there); then its
    start-up objects leave the collector's walks (core/config/startup.py)."""
    config = getattr(getattr(worker, "wsgi", None), "config", None) or {}
    if "LANEWAY_SETTINGS" in config:
        session_factory(config["LANEWAY_SETTINGS"])
    freeze_startup_objects()


# Access lines leave the request's thread (webapp/accesslog.py).
logger_class = "webapp.accesslog.AccessLogger"


def worker_exit(_server: Any, worker: Any) -> None:
    """A worker that stops writes the access lines still waiting for its writer thread."""
    drain = getattr(getattr(worker, "log", None), "drain", None)
    if drain is not None:
        drain()


# gthread, with a kept-alive connection's next request read by the thread that answered
# the last one when it comes at once (webapp/gunicorn_worker.py).
worker_class = "webapp.gunicorn_worker.Worker"
