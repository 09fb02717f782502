"""Redis goes away for 8 s and comes back empty (the issue's case: a restart without
persistence), at the default reconcile interval: workers and beat lose their connections
and reconnect, and the lost chunks are sent again within seconds of that, not on the
reconciler's slow path (80 s of grace at the default 30 s interval).

Redis itself is shared by every test run on the machine, so the outage is a forwarder in
front of it (tests/faults/forward.py) killed and started again on its port, with this
run's Redis db emptied meanwhile: to the workers it is one Redis that restarted empty."""

from __future__ import annotations

import time
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from tests.e2e.procs import wait_for
from tests.faults.harness import (
    RECOVERY_DEADLINE,
    assert_recovered,
    beat,
    cpu_worker,
    events,
    forwarder,
    job_report,
    submit,
    wait_final,
    wait_under_way,
)
from tests.faults.test_redis_flushed import PROMPT_RESEND

pytestmark = pytest.mark.e2e
OUTAGE = 8  # seconds, as in the issue


def reconnected(proc, before: int) -> bool:
    """The worker logged a new broker connection since it had logged `before` of them."""
    return proc.log.read_text().count("Connected to redis://") > before


def test_redis_restarted_empty_lost_chunks_go_out_within_seconds_of_reconnecting(
    settings, migrated, account_factory, tmp_path
):
    account, _ = account_factory("trial")
    n = 160
    parts = urlsplit(settings.redis_url)
    target = f"{parts.hostname}:{parts.port}"
    fwd, ports = forwarder("127.0.0.1", [target], tmp_path, "redis-forward")
    port = ports[target]
    through = urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))
    env = {"LANEWAY_REDIS_URL": through, "LANEWAY_RECONCILE_INTERVAL": "30"}
    job_id = submit(settings, account, n)
    procs = [beat(tmp_path, "beat-restart", env=env)]
    procs.append(cpu_worker(tmp_path, "cpu-restart", env=env))
    worker = procs[1]
    try:
        wait_under_way(settings, job_id, procs, queued=3)
        connections = worker.log.read_text().count("Connected to redis://")
        fwd.stop()  # every connection to "Redis" drops
        redis.Redis.from_url(settings.redis_url).flushdb()  # it comes back empty...
        time.sleep(OUTAGE)  # ...after the outage the issue names (the fault, not a wait)
        fwd, _ = forwarder("127.0.0.1", [target], tmp_path, "redis-forward-2", port=port)
        back = time.monotonic()
        wait_for(lambda: reconnected(worker, connections), 60, "the worker to reconnect",
                 procs)  # fmt: skip
        reconnect = time.monotonic()
        wait_for(lambda: events(settings, job_id, "chunk_redispatched"), PROMPT_RESEND,
                 "the lost chunks to be sent again", procs,
                 report=lambda: job_report(settings, job_id))  # fmt: skip
        resent = time.monotonic()
        status = wait_final(settings, job_id, RECOVERY_DEADLINE, procs)
        done = time.monotonic()
    finally:
        for proc in reversed(procs):
            proc.stop()
        fwd.stop()
    assert_recovered(settings, job_id, n, status)
    print(
        f"FIGURES redis restarted empty: items={n} outage={OUTAGE}s "
        f"reconnected_in={reconnect - back:.1f}s resent_after_reconnect={resent - reconnect:.1f}s "
        f"done_in={done - back:.1f}s"
    )
