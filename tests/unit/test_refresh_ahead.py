"""The web process's read-ahead pool: jobs run off the caller's thread, on one pool per
process."""

from __future__ import annotations

import os
import threading

from webapp import refresh_ahead


def test_jobs_run_on_the_processs_one_pool_off_the_callers_thread():
    names: list[str] = []
    first = refresh_ahead.read_ahead(lambda: names.append(threading.current_thread().name))
    second = refresh_ahead.read_ahead(lambda: names.append(threading.current_thread().name))
    first.result(5), second.result(5)
    assert all(n.startswith("laneway-ahead") for n in names) and len(names) == 2
    assert threading.current_thread().name not in names
    assert list(refresh_ahead._pools) == [os.getpid()]
