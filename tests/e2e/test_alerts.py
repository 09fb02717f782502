"""Alerts through the real fleet to a local Slack-compatible receiver: a deep queue, a dead
letter and a failed job each alert once per interval, and the webhook URL is never logged."""

from __future__ import annotations

import pytest

from core.vocab import POISON_MARKER
from tests.e2e.procs import wait_for
from tests.faults.harness import beat, cpu_worker, submit, wait_final
from tests.receiver import Receiver

pytestmark = pytest.mark.e2e


def test_deep_queue_dead_letter_and_failed_job_alert_once_each(
    settings, migrated, account_factory, tmp_path
):
    import redis

    from core.queueing.alerts import alert_key

    r = redis.Redis.from_url(settings.redis_url)
    r.delete(*(alert_key(c) for c in ("depth:cpu", "dead_letter", "job_failed")))
    account, _ = account_factory("trial")
    with Receiver() as hook:
        env = {
            "LANEWAY_ALERT_WEBHOOK_URL": hook.secret_url,
            "LANEWAY_ALERT_DEPTH": "2",
            "LANEWAY_ALERT_INTERVAL": "300",
            "LANEWAY_RECONCILE_INTERVAL": "2",
            "LANEWAY_FAULTS": "poison",
            "LANEWAY_CHUNK_RETRIES": "0",
        }
        procs = [beat(tmp_path, env=env), cpu_worker(tmp_path, "cpu-alerts", env=env)]
        try:
            deep = submit(settings, account, 160, "d")  # 10 chunks wait: depth above 2
            failing = [
                submit(settings, account, 2, f"f{n}-", text=f"{POISON_MARKER} broken")
                for n in range(2)
            ]
            for job_id in (deep, *failing):
                wait_final(settings, job_id, 240, procs)

            kinds = ("the cpu lane holds", "dead letter(s) in job", "none of its items succeeded")

            def each_kind():
                return all(any(k in t for t in hook.texts()) for k in kinds)

            wait_for(each_kind, 60, "the three alerts", procs)
        finally:
            for proc in reversed(procs):
                proc.stop()
    texts = hook.texts()
    assert sum("the cpu lane holds" in t for t in texts) == 1
    assert sum("dead letter(s) in job" in t for t in texts) == 1  # two jobs, one alert
    assert sum("failed: none of its items succeeded" in t for t in texts) == 1
    assert len(texts) == 3
    assert all(p == f"/services/{hook.token}" for p in hook.paths)
    for proc in procs:  # the URL carries a secret: no log may show it
        assert hook.token not in proc.log.read_text()
