"""What a long-running process does once it has started: its imports and start-up objects
(torch, transformers, Celery, Flask, SQLAlchemy, the models: 200,000-450,000 objects) move
out of the garbage collector's reach (`gc.freeze`, as the Python docs advise for servers).
A full collection walked them all and stopped every thread of the process meanwhile:
measured under bench/latency.py, 264-266 ms in the interactive worker and 59-134 ms in a
web worker, twice and four times a minute; frozen, 3 ms and 7-10 ms (docs/benchmarks.md,
issue 19). Objects made later are collected as before.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Collect what start-up left as garbage, then freeze the rest; how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
