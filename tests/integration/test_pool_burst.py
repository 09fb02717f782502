"""A burst of jobs stored at once (the interactive path's 202 fallbacks, say) on the real
Postgres pool: each job holds one connection, so a burst larger than the pool waits its
turn instead of deadlocking it (every holder waiting for a second connection until the
pool's 30 s timeout, then a 503 each: docs/journal/)."""

from __future__ import annotations

import threading
from collections import Counter

from sqlalchemy import event

from db.session import session_factory
from jobs.submit import submit_job


def test_storing_a_job_holds_one_connection_at_a_time(settings, account_factory):
    account, _ = account_factory("trial")
    engine = session_factory(settings).kw["bind"]
    held: Counter[int] = Counter()
    most: Counter[int] = Counter()

    def checkout(*_):  # noqa: ANN002
        me = threading.get_ident()
        held[me] += 1
        most[me] = max(most[me], held[me])

    def checkin(*_):  # noqa: ANN002
        held[threading.get_ident()] -= 1

    event.listen(engine, "checkout", checkout)
    event.listen(engine, "checkin", checkin)
    try:
        job = submit_job(account, [(str(i), f"text {i}") for i in range(40)], settings=settings)
    finally:
        event.remove(engine, "checkout", checkout)
        event.remove(engine, "checkin", checkin)
    assert job.total_items == 40
    assert most[threading.get_ident()] == 1, "a second connection while the first was held"


def test_a_burst_three_times_the_pool_is_stored_whole(settings, account_factory):
    account, _ = account_factory("trial")
    engine = session_factory(settings).kw["bind"]
    size = engine.pool.size() + engine.pool._max_overflow  # noqa: SLF001 - its capacity
    burst = 3 * size
    start = threading.Barrier(burst)
    stored: list[str] = []
    errors: list[BaseException] = []

    def one(n: int) -> None:
        items = [(f"{n}-{i}", f"burst {n} text {i}") for i in range(5)]
        start.wait()
        try:
            stored.append(str(submit_job(account, items, settings=settings).id))
        except BaseException as exc:  # noqa: BLE001 - counted and shown below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(burst)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    assert len(set(stored)) == burst
