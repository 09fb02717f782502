"""GET /metrics: every process's metrics on this machine, the queues' depth, off by setting."""

from __future__ import annotations

import json
import re
import uuid

import redis


def _value(text: str, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    assert match, f"{sample} not in\n{text[:2000]}"
    return float(match.group(1))


def test_metrics_show_recorded_work_and_the_queues_depth(client, settings):
    from laneway import metrics

    before = client.get("/metrics")
    assert before.status_code == 200 and before.mimetype == "text/plain"
    processed = 'laneway_items_processed_total{lane="gpu"}'
    start = _value(before.text, processed) if processed in before.text else 0.0
    metrics.record_items("gpu", 70, 3)
    metrics.record_model("gpu", 0.4, [32, 32, 6])
    r = redis.Redis.from_url(settings.redis_url)
    message = json.dumps({"headers": {"id": "metrics-test"}})
    r.lpush("gpu", message)
    try:
        text = client.get("/metrics").text
    finally:
        r.lrem("gpu", 0, message)
    assert _value(text, processed) == start + 67
    assert _value(text, 'laneway_items_failed_total{lane="gpu"}') >= 3
    assert _value(text, 'laneway_batch_size_bucket{lane="gpu",le="8.0"}') >= 1
    assert _value(text, 'laneway_model_stage_seconds_count{lane="gpu"}') >= 1
    assert _value(text, 'laneway_queue_queued{queue="gpu"}') >= 1
    assert _value(text, 'laneway_queue_depth{queue="gpu"}') >= 1
    # No account's data: no job ids, no account names, no keys.
    assert "account" not in text and "lw_" not in text


def test_a_scrape_reads_the_delivered_messages_once_for_every_queue(client, settings):
    """kombu keeps every queue's delivered messages in one hash: a scrape reads it once,
    not once per queue, and still counts each queue's own."""
    from tasks.app import QUEUES
    from tasks.broker import PRIORITY_SEP, PRIORITY_STEPS, UNACKED

    def depths(text: str) -> dict[str, float]:
        return {
            f"{kind} {queue}": _value(text, f'laneway_queue_{kind}{{queue="{queue}"}}')
            for kind in ("queued", "delivered")
            for queue in ("gpu", "interactive.cpu")
        }

    r = redis.Redis.from_url(settings.redis_url)
    before = depths(client.get("/metrics").text)
    tags = {f"scrape-{n}-{uuid.uuid4().hex}": q for n, q in enumerate(("gpu", "gpu", "cpu"))}
    for tag, queue in tags.items():
        r.hset(UNACKED, tag, json.dumps([{"headers": {"id": tag}}, "", queue]))
    waiting = f"interactive.cpu{PRIORITY_SEP}9"  # a priority step's list counts too
    r.lpush(waiting, "{}")
    marker = f"scrape-done-{uuid.uuid4().hex}"
    db = r.connection_pool.connection_kwargs.get("db", 0)
    try:
        with r.monitor() as monitor:
            text = client.get("/metrics").text
            r.echo(marker)
            commands = []
            while marker not in (seen := monitor.next_command())["command"]:
                if seen["db"] == db:
                    commands.append(seen["command"].split()[0].upper())
    finally:
        r.hdel(UNACKED, *tags)
        r.delete(waiting)
    assert commands.count("HVALS") == 1, commands
    assert commands.count("LLEN") == len(QUEUES) * len(PRIORITY_STEPS), commands
    after = depths(text)
    assert after["delivered gpu"] == before["delivered gpu"] + 2
    assert after["queued interactive.cpu"] == before["queued interactive.cpu"] + 1
    assert after["delivered interactive.cpu"] == before["delivered interactive.cpu"]
    assert after["queued gpu"] == before["queued gpu"]


def test_metrics_can_be_turned_off(make_app):
    response = make_app(metrics=False).test_client().get("/metrics")
    assert response.status_code == 404 and "LANEWAY_METRICS" in response.json["message"]
