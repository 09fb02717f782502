"""A no-op Celery task for measuring one hop (bench/stages.py)."""

import os

from celery import Celery

url = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/13")
app = Celery("hop", broker=url, backend=url)


@app.task(name="hop.noop")
def noop() -> None:
    return None
