"""The naive design, a benchmark baseline: one Celery task per item.

The text travels in the message and the output comes back through the result backend; no
chunking, no micro-batching. `bench/throughput.py` compares the fleet against it and starts
its worker with `--include bench.naive`, so production workers never load this task.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from core.queueing.celery_app import LanewayTask
from workers.model_host import get_pipeline


@shared_task(name="laneway.naive_item", base=LanewayTask)
def naive_item(text: str, tasks: list[str], labels: list[str]) -> dict[str, Any]:
    outputs, _ = get_pipeline().run([text], tasks, labels)
    return outputs[0]
