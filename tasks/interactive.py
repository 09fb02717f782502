"""The interactive task: one message of small requests, answered through this worker's
batcher (workers/interactive_server.py)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from workers.interactive_server import server


@shared_task(name="laneway.interactive", acks_late=False, ignore_result=True)
def interactive(requests: list[dict[str, Any]]) -> None:
    """Acknowledged on receipt: a request lost with its worker is the web app's to recover
    (it stores a job at its timeout), and a late redelivery would only compute what nobody
    waits for."""
    server().serve(requests)
