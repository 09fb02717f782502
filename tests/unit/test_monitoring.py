"""The dashboard and the alert rules as code (deploy/monitoring): promtool accepts the rules,
the scrape config and every dashboard query, the rules' own unit tests pass, each rule says
what to do, the dashboard shows what the issue lists, and the Kubernetes files ship the very
same rules and dashboard. tests/e2e/test_monitoring.py runs them against a real fleet."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from tests.monitoring import (
    DASHBOARD,
    MONITORING,
    ROOT,
    RULES,
    dashboard,
    dashboard_exprs,
    rules,
    tool,
)


def promtool(*args: str) -> str:
    argv = [tool("promtool"), *args]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=RULES.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_promtool_accepts_the_rules_and_the_scrape_config():
    assert f"SUCCESS: {len(rules())} rules found" in promtool("check", "rules", str(RULES))
    promtool("check", "config", str(RULES.parent / "prometheus.yml"))


@pytest.mark.slow
def test_the_rules_pass_their_promtool_unit_tests():
    promtool("test", "rules", "rules_test.yml")
    tested = set(re.findall(r"alertname: (\w+)", (RULES.parent / "rules_test.yml").read_text()))
    assert tested == {r["alert"] for r in rules()}, "every alert has a promtool test"


# Grafana's variables in queries, given values Prometheus parses.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


@pytest.mark.slow
def test_every_dashboard_query_is_valid_promql(tmp_path):
    """Each query as a recording rule: promtool parses it as Prometheus would."""
    records = []
    for n, expr in enumerate(dashboard_exprs()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"an unknown Grafana variable in {expr}"
        records.append({"record": f"dashboard:query_{n}", "expr": expr})
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    promtool("check", "rules", str(path))


def test_each_alert_says_how_bad_and_what_to_do():
    found = rules()
    for rule in found:
        name = rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), f"{name} fires on one evaluation"
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 40
    # The webhook's conditions (tasks/alerts.py) and those only an outside watcher sees.
    assert {r["alert"] for r in found} == {
        "LanewayLaneDeep", "LanewayDeadLetters", "LanewayJobsFailing", "LanewayBeatStalled",
        "LanewayReconcilerStalled", "LanewayNoInteractiveWorker", "LanewayMetricsMissing",
    }  # fmt: skip


def test_the_dashboard_shows_what_operators_look_for():
    board = dashboard()
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    exprs = " ".join(dashboard_exprs())
    for wanted in ("laneway_queue_depth", "rate(laneway_items_processed_total",
                   "laneway_batch_size_bucket", "histogram_quantile(0.95",
                   "laneway_model_stage_seconds_bucket", "laneway_job_seconds_bucket",
                   "laneway_cost_dollars_total", "laneway_dead_letters",
                   'laneway_workers_alive{queue=~"gpu'):  # fmt: skip
        assert wanted in exprs, wanted
    # One data source variable: the same file works in compose's Grafana and in a
    # cluster's, whatever the Prometheus data source is called there.
    (variable,) = board["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_kubernetes_gets_the_same_rules_and_dashboard():
    docs = {d["kind"]: d for d in yaml.safe_load_all((MONITORING / "operator.yaml").read_text())}
    assert docs["PrometheusRule"]["spec"] == yaml.safe_load(RULES.read_text()), (
        "operator.yaml's PrometheusRule differs from prometheus/rules.yml: copy its groups"
    )
    # The ServiceMonitor finds the web Service by its labels and its port by name.
    web = {
        (d["kind"], d["metadata"]["name"]): d
        for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "web.yaml").read_text())
    }[("Service", "laneway-web")]
    monitor = docs["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= web["metadata"]["labels"].items()
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] in {p["name"] for p in web["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    config = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    (generated,) = config["configMapGenerator"]
    assert generated["files"] == [str(DASHBOARD.relative_to(MONITORING))]
    assert generated["options"]["labels"] == {"grafana_dashboard": "1"}


@pytest.mark.slow
def test_kustomize_renders_the_dashboard_configmap():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl (for `kubectl kustomize`)")
    rendered = subprocess.run(
        [kubectl, "kustomize", str(MONITORING)], capture_output=True, text=True, check=True
    ).stdout
    docs = {d["kind"]: d for d in yaml.safe_load_all(rendered)}
    config = docs["ConfigMap"]
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config["data"]["laneway.json"]) == dashboard()
    assert {"ServiceMonitor", "PrometheusRule"} <= set(docs)
