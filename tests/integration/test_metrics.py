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
    from core.obs import metrics

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
    # No account's data: no job ids, no account names, no keys (the lanes' share is by
    # account type, the one label that names accounts at all).
    assert "account" not in text.replace("account_type", "") and "lw_" not in text


def test_a_scrape_reads_the_delivered_messages_once_for_every_queue(client, settings):
    """kombu keeps every queue's delivered messages in one hash: a scrape reads it once,
    not once per queue, and still counts each queue's own."""
    from core.queueing.broker import PRIORITY_SEP, PRIORITY_STEPS, UNACKED
    from core.queueing.celery_app import INTERACTIVE_QUEUES, QUEUES
    from core.store.interactive_protocol import requests_key

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
    listed = requests_key("cpu")  # and the interactive requests waiting on their list
    r.rpush(listed, "{}", "{}")
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
        r.delete(waiting, listed)
    assert commands.count("HVALS") == 1, commands
    # One round trip: each queue's priority lists, and each interactive lane's request list.
    lists = len(QUEUES) * len(PRIORITY_STEPS) + len(INTERACTIVE_QUEUES)
    assert commands.count("LLEN") == lists, commands
    after = depths(text)
    assert after["delivered gpu"] == before["delivered gpu"] + 2
    assert after["queued interactive.cpu"] == before["queued interactive.cpu"] + 3
    assert after["delivered interactive.cpu"] == before["delivered interactive.cpu"]
    assert after["queued gpu"] == before["queued gpu"]


def test_metrics_can_be_turned_off(make_app):
    response = make_app(metrics=False).test_client().get("/metrics")
    assert response.status_code == 404 and "LANEWAY_METRICS" in response.json["message"]


def test_metrics_show_the_fleets_health_from_postgres_and_redis(client, settings):
    """Live workers by queue (a stale or stopped one is not), open dead letters (one sent
    back is not), beat's and the reconciler's marks, and the thresholds the rules use."""
    from sqlalchemy import delete, update

    from core.store.fleet_metrics import mark, mark_key
    from db.common import utcnow
    from db.models import DeadLetter, Worker
    from db.session import session_scope
    from tests.factories import add_worker, stored_job

    r = redis.Redis.from_url(settings.redis_url)
    r.delete(mark_key("beat"), mark_key("reconcile"))
    before = client.get("/metrics").text
    alive = 'laneway_workers_alive{queue="interactive.cpu"}'
    # Every queue is there, consumed or not: "no interactive worker" is a 0, not a gap.
    start = _value(before, alive)
    assert _value(before, 'laneway_workers_alive{queue="interactive.gpu"}') >= 0
    letters = _value(before, "laneway_dead_letters_open")
    # Never marked: 0, so that "beat has not ticked for long" holds for a beat never seen.
    assert _value(before, "laneway_beat_last_tick_timestamp_seconds") == 0
    assert _value(before, "laneway_alert_depth") == settings.alert_depth
    assert _value(before, "laneway_reconcile_interval_seconds") == settings.reconcile_interval

    live = add_worker(settings, ["interactive.cpu"])
    stale = add_worker(settings, ["interactive.cpu"], seen_ago=settings.worker_dead_after + 5)
    stopped = add_worker(settings, ["interactive.cpu"])
    job_id, _ = stored_job(settings, ["a", "b"], prefix="dl")
    with session_scope(settings) as session:
        session.execute(update(Worker).where(Worker.id == stopped).values(stopped_at=utcnow()))
        for retried in (None, utcnow()):
            session.add(
                DeadLetter(job_id=job_id, kind="item", idxs=[0], item_ids=["dl0"],
                           error="boom", attempts=1, retried_at=retried)
            )  # fmt: skip
    mark("beat", settings, now=1_700_000_000.5)
    mark("reconcile", settings, now=1_700_000_100.0)
    try:
        text = client.get("/metrics").text
    finally:
        with session_scope(settings) as session:
            session.execute(delete(Worker).where(Worker.id.in_((live, stale, stopped))))
            session.execute(delete(DeadLetter).where(DeadLetter.job_id == job_id))
    assert _value(text, alive) == start + 1
    assert _value(text, "laneway_dead_letters_open") == letters + 1
    assert _value(text, "laneway_beat_last_tick_timestamp_seconds") == 1_700_000_000.5
    assert _value(text, "laneway_reconcile_last_run_timestamp_seconds") == 1_700_000_100.0
    # A mark that is no number (a hand-edited key) reads as never marked, not a failed scrape.
    r.set(mark_key("beat"), "yesterday")
    try:
        response = client.get("/metrics")
    finally:
        r.delete(mark_key("beat"))
    assert response.status_code == 200
    assert _value(response.text, "laneway_beat_last_tick_timestamp_seconds") == 0


def test_metrics_without_the_database_still_show_the_queues(make_app, settings):
    """Postgres down: the scrape answers with what Redis holds, not a 500."""

    down = settings.replace(database_url="postgresql+psycopg://nobody@127.0.0.1:1/none")
    from webapp import create_app

    response = create_app(down).test_client().get("/metrics")
    assert response.status_code == 200
    assert "laneway_queue_depth" in response.text
    assert "laneway_workers_alive" not in response.text


def test_a_reconciler_pass_marks_its_end(settings, migrated):
    """The stalled-reconciler alert reads this mark: a whole pass writes it."""
    import time

    from core.store.fleet_metrics import mark_key
    from tasks.maintenance import reconcile

    r = redis.Redis.from_url(settings.redis_url)
    r.delete(mark_key("reconcile"))
    started = time.time()
    reconcile()
    assert float(r.get(mark_key("reconcile"))) >= started


def test_a_reconciler_pass_returns_what_celery_stores(settings, migrated):
    """A worker stores the pass's outcome in the result backend as JSON: every part is
    data (each lane's depth, not the function that reads them)."""
    from kombu.utils.json import dumps, loads

    from core.vocab import LANES
    from tasks.maintenance import reconcile

    outcome = loads(dumps(reconcile()))
    assert set(outcome["depth"]) == set(LANES)
    assert all(isinstance(n, int) for n in outcome["depth"].values())
