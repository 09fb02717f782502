"""A worker pod's own /metrics, as Kubernetes scrapes it: a real `laneway worker cpu` with
its own LANEWAY_HOME (a pod's emptyDir, which no web app reads) serves its metrics folder
on LANEWAY_WORKER_METRICS_PORT; a real Prometheus (Debian's) scrapes it alone with the
shipped rules, and a real job whose items all fail raises LanewayJobsFailing, while a job
that succeeds first raises nothing."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from core.vocab import POISON_MARKER
from tests.e2e.procs import Proc, free_port, http, wait_for
from tests.faults.harness import cpu_worker, submit, wait_final
from tests.monitoring import alerts, prometheus_argv

pytestmark = pytest.mark.e2e


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the series `name{labels}` in an exposition, or None if absent."""
    for line in text.splitlines():
        match = re.fullmatch(r"([a-z_]+)\{(.*)\} (\S+)", line)
        if match and match[1] == name:
            found = dict(re.findall(r'(\w+)="([^"]*)"', match[2]))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(match[3])
    return None


def test_a_worker_serves_its_metrics_and_a_failing_job_fires_the_alert(
    settings, migrated, account_factory, tmp_path
):
    pod_home = tmp_path / "pod"  # the pod's emptyDir: its metrics folder is the worker's alone
    port, prometheus_port = free_port(), free_port()
    env = {
        "LANEWAY_HOME": str(pod_home),
        "LANEWAY_WORKER_METRICS_PORT": str(port),
        "LANEWAY_WORKER_METRICS_HOST": "127.0.0.1",
        "LANEWAY_FAULTS": "poison",
        "LANEWAY_CHUNK_RETRIES": "0",
    }
    account, _ = account_factory("standard")
    procs = [cpu_worker(tmp_path, "worker-metrics", env=env, name="cpu-metrics")]
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        # Before any job: the failed jobs' series is there, at 0 (metrics.declare_series),
        # so that Prometheus sees the first failure as an increase.
        def served() -> httpx.Response | None:
            try:
                return http.get(url, timeout=5)
            except httpx.TransportError:
                return None  # the worker answers pings a moment before it serves

        scrape = wait_for(served, 30, "the worker's /metrics", procs)
        assert scrape.status_code == 200
        assert sample(scrape.text, "laneway_job_seconds_count", lane="cpu", status="failed") == 0
        assert list(pod_home.glob("metrics/*.db")), "the worker writes into its own folder"

        procs.append(Proc("prometheus", prometheus_argv(tmp_path, f"127.0.0.1:{port}",
                                                         prometheus_port), tmp_path))  # fmt: skip
        seen: list[dict] = []

        def held() -> list[dict]:
            now = alerts(http, prometheus_port)
            seen.extend(now)
            return now

        def query(expr: str) -> list[dict]:
            api = f"http://127.0.0.1:{prometheus_port}/api/v1/query"
            try:
                found = http.get(api, params={"query": expr}, timeout=5)
            except httpx.TransportError:
                return []
            return found.json()["data"]["result"] if found.status_code == 200 else []

        wait_for(lambda: query("up == 1"), 60, "Prometheus's first scrape of the worker", procs)
        # A job that succeeds: Prometheus sees its end, and LanewayJobsFailing stays quiet
        # for several evaluations after.
        good = submit(settings, account, 3, "ok")
        assert wait_final(settings, good, 120, procs) == "succeeded"
        ended = 'laneway_job_seconds_count{lane="cpu",status="succeeded"} == 1'
        wait_for(lambda: query(ended), 30, "the good job's end in Prometheus", procs)
        settled = time.monotonic() + 5
        wait_for(lambda: held() is not None and time.monotonic() > settled, 30, "evaluations",
                 procs)  # fmt: skip
        quiet_until = len(seen)

        bad = submit(settings, account, 3, "bad", text=f"{POISON_MARKER} broken")
        assert wait_final(settings, bad, 120, procs) == "failed"

        # The worker counts the job's end just after committing it: the count follows.
        def failed_count() -> float | None:
            return sample(http.get(url).text, "laneway_job_seconds_count", lane="cpu",
                          status="failed")  # fmt: skip

        wait_for(lambda: failed_count() == 1, 30, "the failed job on /metrics", procs)

        def firing() -> bool:
            return any(a["labels"]["alertname"] == "LanewayJobsFailing" and a["state"] == "firing"
                       for a in held())  # fmt: skip

        wait_for(firing, 90, "LanewayJobsFailing firing", procs,
                 report=lambda: "\n".join(str(a) for a in seen[-10:]))  # fmt: skip
    finally:
        for proc in reversed(procs):
            proc.stop()
    early = [a for a in seen[:quiet_until] if a["labels"]["alertname"] == "LanewayJobsFailing"]
    assert not early, f"LanewayJobsFailing went pending before any job failed: {early}"
