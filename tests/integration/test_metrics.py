"""GET /metrics: every process's metrics on this machine, the queues' depth, off by setting."""

from __future__ import annotations

import json
import re

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
    metrics.record_chunk("gpu", 70, 3, 0.4, 32)
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


def test_metrics_can_be_turned_off(make_app):
    response = make_app(metrics=False).test_client().get("/metrics")
    assert response.status_code == 404 and "LANEWAY_METRICS" in response.json["message"]
