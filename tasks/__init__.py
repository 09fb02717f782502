"""The Celery app and its tasks: `celery -A tasks worker -Q cpu` finds `tasks.app`."""

from tasks.app import app

__all__ = ["app"]
