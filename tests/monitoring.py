"""Deploy/monitoring's files and Debian's Prometheus binaries, for the tests that check them."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

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
