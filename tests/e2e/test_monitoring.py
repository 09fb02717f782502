"""The dashboard and the alert rules against a real fleet: every metric they read is on a real
web process's /metrics, and a real Prometheus (Debian's) scraping it fires the alerts whose
conditions the test creates (a deep lane, an open dead letter, no interactive worker) while
those whose conditions do not hold (a stalled beat: a real beat runs; the other lane; a
missing scrape) never even go pending."""

from __future__ import annotations

import re
import time

import pytest
from sqlalchemy import delete

from core.store.fleet_metrics import mark_key
from db.models import DeadLetter
from db.session import session_scope
from tests.broker import quiesce
from tests.e2e.procs import Proc, free_port, http, start_web, wait_for
from tests.faults.harness import beat, submit
from tests.monitoring import alerts as held_alerts
from tests.monitoring import metric_names, prometheus_argv

pytestmark = pytest.mark.e2e

ALERT_DEPTH = 3


@pytest.fixture(scope="module")
def web(migrated, tmp_path_factory):
    # One for the module: the tests read it over HTTP and change nothing in it.
    logdir = tmp_path_factory.mktemp("monitoring-web")
    proc, url = start_web(logdir, env={"LANEWAY_ALERT_DEPTH": str(ALERT_DEPTH)})
    yield proc, url
    proc.stop()


def scraped_names(text: str) -> set[str]:
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if
            line and not line.startswith("#")}  # fmt: skip


def test_every_metric_the_dashboard_and_rules_read_is_on_a_real_scrape(web):
    from core.obs import metrics

    # This process writes to the same metrics folder (LANEWAY_HOME) as the web process:
    # one of each kind of work, as workers record it, so that each family has a sample.
    metrics.record_items("cpu", 4, 1)
    metrics.record_model("cpu", 0.02, [4])
    metrics.record_job("cpu", "succeeded", 1.5, 0.004)
    metrics.record_dead_letters("item", 1)
    _, url = web
    response = http.get(f"{url}/metrics")
    assert response.status_code == 200
    missing = metric_names() - scraped_names(response.text)
    assert not missing, f"the dashboard or the rules read what /metrics does not export: {missing}"


def test_a_real_prometheus_fires_the_rules_whose_conditions_hold(
    web, settings, account_factory, tmp_path
):
    import redis

    web_proc, url = web
    r = redis.Redis.from_url(settings.redis_url)
    # A real beat: its tick reaches Redis, /metrics and Prometheus, so the stalled-beat
    # alert must stay quiet. Prometheus starts once beat has ticked (an earlier test's
    # beat may have left an old mark: it goes first).
    r.delete(mark_key("beat"))
    beat_proc = beat(tmp_path)
    procs = [web_proc, beat_proc]

    def beat_ticked() -> bool:
        return r.exists(mark_key("beat")) == 1

    account, _ = account_factory("standard")
    job_id = None
    try:
        wait_for(beat_ticked, 120, "beat's first tick in Redis", procs)
        # A job no worker takes: its chunks wait in a lane (the gpu lane's first stage runs
        # on the cpu queue), deeper than ALERT_DEPTH.
        job_id = submit(settings, account, 80, "mon")

        def deep_lane() -> str | None:
            depths = http.get(f"{url}/lanes").json()
            return next((q for q in ("cpu", "gpu") if depths[q]["depth"] > ALERT_DEPTH), None)

        lane = wait_for(deep_lane, 30, "the job's chunks in a lane", procs)
        with session_scope(settings) as session:
            session.add(
                DeadLetter(job_id=job_id, kind="item", idxs=[0], item_ids=["mon0"],
                           error="boom", attempts=1)
            )  # fmt: skip
        other = {"cpu": "gpu", "gpu": "cpu"}[lane]

        port = free_port()
        procs.append(Proc("prometheus", prometheus_argv(tmp_path, url[7:], port), tmp_path))
        seen: list[dict] = []

        def alerts() -> list[dict]:
            now = held_alerts(http, port)
            seen.extend(now)
            return now

        def firing(name: str, **labels: str) -> bool:
            return any(
                a["state"] == "firing"
                and a["labels"]["alertname"] == name
                and all(a["labels"].get(k) == v for k, v in labels.items())
                for a in alerts()
            )

        expected = [
            ("LanewayLaneDeep", {"queue": lane}),
            ("LanewayDeadLetters", {}),
            ("LanewayNoInteractiveWorker", {"severity": "critical"}),
        ]
        for name, labels in expected:
            wait_for(lambda: firing(name, **labels), 90, f"{name} {labels} firing", procs,  # noqa: B023
                     report=lambda: "\n".join(str(a) for a in seen[-10:]))  # fmt: skip
        # Several more evaluations, each one that could have raised the quiet ones. Before
        # Prometheus's first scrape nothing is there, and absent() holds: the missing
        # scrape's rule is judged from here on, once scrapes have come in.
        before_scrapes = len(seen)
        last = time.monotonic() + 5
        wait_for(lambda: time.monotonic() > last and alerts(), 30, "more evaluations", procs)
    finally:
        if job_id is not None:
            with session_scope(settings) as session:
                session.execute(delete(DeadLetter).where(DeadLetter.job_id == job_id))
        quiesce(settings)  # the job's messages go: later tests start with empty lanes
    quiet = [
        a["labels"]
        for n, a in enumerate(seen)
        if a["labels"]["alertname"] == "LanewayBeatStalled"
        or (a["labels"]["alertname"] == "LanewayMetricsMissing" and n >= before_scrapes)
        or (a["labels"]["alertname"] == "LanewayLaneDeep" and a["labels"]["queue"] == other)
    ]
    assert not quiet, f"alerts whose conditions never held went pending or fired: {quiet}"
    (deep,) = [a for a in seen if a["labels"]["alertname"] == "LanewayLaneDeep"][-1:]
    assert float(deep["value"]) > ALERT_DEPTH
