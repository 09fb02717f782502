"""Deploy/monitoring's files and Debian's Prometheus binaries, for the tests that check them."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "prometheus" / "rules.yml"
DASHBOARD = MONITORING / "grafana" / "laneway.json"
# Debian's package `prometheus` (`make prometheus`) puts both here; another folder may be
# named for a machine where they live elsewhere.
BIN = Path(os.environ.get("LANEWAY_TEST_PROMETHEUS_BIN", "/usr/bin"))
METRIC = re.compile(r"\blaneway_[a-z0-9_]+")


def tool(name: str) -> str:
    """The path of `promtool` or `prometheus`; the test fails without it."""
    path = BIN / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"no {name} at {path}: run `make prometheus` (apt-get install prometheus)")
    return str(path)


def rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def metric_names() -> set[str]:
    """Every laneway_* series the dashboard and the rules read."""
    exprs = dashboard_exprs() + [r["expr"] for r in rules()]
    return {name for expr in exprs for name in METRIC.findall(expr)}


def prometheus_config(tmp_path: Path, target: str) -> str:
    """A 1 s scrape and evaluation of `target` (host:port, its /metrics), and a copy of
    rules.yml with every `for` cut to 1 s: the shipped rules' expressions, judged at once."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "1s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yml"],
        "scrape_configs": [{"job_name": "laneway", "static_configs": [{"targets": [target]}]}],
    }
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def prometheus_argv(tmp_path: Path, target: str, port: int) -> list[str]:
    """Debian's Prometheus scraping `target`, its storage and config in tmp_path."""
    return [
        tool("prometheus"),
        f"--config.file={prometheus_config(tmp_path, target)}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]


def alerts(http: httpx.Client, port: int) -> list[dict]:
    """The alerts Prometheus on `port` holds now; none while it is not up yet."""
    try:
        found = http.get(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=5)
    except httpx.TransportError:
        return []
    if found.status_code == 503:
        # Prometheus answers "Service Unavailable" until its storage is ready.
        return []
    found.raise_for_status()
    return found.json()["data"]["alerts"]
