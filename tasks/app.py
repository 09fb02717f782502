"""The worker's entry module: `celery -A tasks worker -Q cpu` finds `tasks.app:app`.

It builds the one Celery app from this process's settings (core/queueing/celery_app.py) with the
task modules, and connects the worker's signal handlers (workers/signals.py).
"""

from __future__ import annotations

import os

from core.config.settings import get_settings
from core.queueing.celery_app import make_celery
from workers.cores import openmp_env

# Idle OpenMP threads spin briefly, then sleep: on a shared CPU a long-spinning batch worker
# would take the cores an interactive request needs. Set before torch is imported.
os.environ.update(openmp_env())

import workers.signals  # noqa: E402, F401 - connects the handlers; imports torch's users

TASK_MODULES = (
    "tasks.chunks",
    "tasks.aggregate",
    "tasks.maintenance",
    "tasks.alerts",
    "tasks.scaling",
    "tasks.inbox",
    "tasks.interactive",
)

app = make_celery(get_settings(), include=TASK_MODULES)
