"""The interactive task: one message of small requests, answered through this worker's
batcher (workers/interactive_server.py), which is imported on the task's first run: it
imports torch, and every process that imports the task modules (beat, Flower) would too."""

from __future__ import annotations

from typing import Any

from celery import shared_task


@shared_task(name="laneway.interactive", acks_late=False, ignore_result=True)
def interactive(requests: list[dict[str, Any]]) -> None:
    """Acknowledged on receipt: a request lost with its worker is the web app's to recover
    (it stores a job at its timeout), and a late redelivery would only compute what nobody
    waits for."""
    from workers.interactive_server import server

    server().serve(requests)
