"""What `kubectl kustomize` renders from deploy/k8s and each overlay in deploy/overlays:
every manifest passes Kubernetes' own schema (kubernetes-validate, strict: a misspelt field
fails), every pod meets Pod Security "restricted", every image is named by version, no
Secret ships, the PodDisruptionBudgets cover what a drain must not empty, and every worker
pod exposes the /metrics its annotations and deploy/monitoring's PodMonitor scrape."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # renders each tree with kubectl kustomize, a process

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.parent for p in (ROOT / "deploy" / "overlays").glob("*/kustomization.yaml"))
TREES = [BASE, *OVERLAYS]
# The oldest Kubernetes the manifests are for (policy/v1 budgets, autoscaling/v2, the
# restricted profile's seccomp field) and the newest kubernetes-validate knows.
KUBERNETES = ("1.29.0", "1.37.0")
# Kinds from operators' CRDs, which no Kubernetes schema holds: KEDA's (gpu-workers.yaml)
# and the Prometheus Operator's (deploy/monitoring, applied on its own).
CRD_KINDS = {"ScaledObject", "ServiceMonitor", "PodMonitor", "PrometheusRule"}
WORKERS = {"laneway-worker-cpu", "laneway-worker-interactive", "laneway-worker-gpu"}


def kubectl() -> str:
    """The kubectl on PATH, else the one `make kubectl` puts beside this Python."""
    local = Path(sys.executable).parent / "kubectl"
    found = shutil.which("kubectl") or (str(local) if local.exists() else None)
    if found is None:
        pytest.fail("no kubectl: run `make kubectl`")
    return found


def render(tree: Path) -> list[dict]:
    done = subprocess.run([kubectl(), "kustomize", str(tree)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module", params=TREES, ids=lambda p: str(p.relative_to(ROOT)))
def rendered(request) -> list[dict]:
    return render(request.param)


def validator():
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("no kubernetes-validate: run `make .venv/bin/kubernetes-validate`")
    return kubernetes_validate


def schema_errors(doc: dict) -> list[str]:
    """What Kubernetes' schema says of `doc`, for each version checked; [] when valid."""
    kv = validator()
    errors = []
    for version in KUBERNETES:
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:
            errors.append(f"{version}: {exc.message}")
    return errors


def test_there_are_overlays_to_check():
    assert OVERLAYS, "deploy/overlays holds no overlay"


def test_every_manifest_passes_the_kubernetes_schema(rendered):
    kv = validator()
    unchecked = set()
    for doc in rendered:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        try:
            assert not schema_errors(doc), f"{where}: {schema_errors(doc)}"
        except kv.SchemaNotFoundError:
            unchecked.add(doc["kind"])
    assert unchecked <= CRD_KINDS, f"no schema for {unchecked - CRD_KINDS}"


def test_the_schema_check_catches_a_misspelt_field(rendered):
    """The checker is strict: a field the schema lacks, or a value of the wrong type, fails."""
    deployment = next(d for d in rendered if d["kind"] == "Deployment")
    misspelt = copy.deepcopy(deployment)
    container = misspelt["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"]["readOnlyRootFileSystem"] = True
    assert schema_errors(misspelt)
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] = "yes"
    assert schema_errors(wrong_type)


def pods(rendered: list[dict]) -> dict[str, dict]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]
        for d in rendered
        if d["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet")
    }


def test_every_pod_meets_pod_security_restricted(rendered):
    for name, template in pods(rendered).items():
        spec = template["spec"]
        pod = spec.get("securityContext", {})
        assert pod.get("runAsNonRoot") is True, name
        assert pod.get("runAsUser", 0) > 0, name
        assert pod.get("seccompProfile") == {"type": "RuntimeDefault"}, name
        assert not spec.get("hostNetwork") and not spec.get("hostPID"), name
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        assert not [v for v in volumes.values() if "hostPath" in v], name
        for container in spec["containers"] + spec.get("initContainers", []):
            where = f"{name}/{container['name']}"
            context = container.get("securityContext", {})
            assert context.get("allowPrivilegeEscalation") is False, where
            assert context.get("capabilities") == {"drop": ["ALL"]}, where
            assert context.get("readOnlyRootFilesystem") is True, where
            assert not context.get("privileged"), where
            assert context.get("runAsUser", 1) != 0, where
            # A read-only root: /tmp is a volume of the pod's own.
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert "emptyDir" in volumes[mounts["/tmp"]], where


def test_every_image_is_named_by_version(rendered):
    for name, template in pods(rendered).items():
        for container in template["spec"]["containers"]:
            image = container["image"]
            repository, _, tag = image.rpartition(":")
            assert repository and "/" not in tag and tag not in ("", "latest"), f"{name}: {image}"


def test_no_secret_ships(rendered):
    assert not [d for d in rendered if d["kind"] == "Secret"]
    for name, template in pods(rendered).items():
        for container in template["spec"]["containers"]:
            refs = [
                s["secretRef"]["name"] for s in container.get("envFrom", []) if "secretRef" in s
            ]
            assert refs in ([], ["laneway"]), name  # the Secret the user creates
    shipped = [p for p in (ROOT / "deploy").rglob("*.yaml") if "kind: Secret" in p.read_text()]
    assert not shipped, shipped


def selects(selector: dict, labels: dict) -> bool:
    ok = selector.get("matchLabels", {}).items() <= labels.items()
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In"
        ok = ok and labels.get(expr["key"]) in expr["values"]
    return ok


def test_disruption_budgets_cover_what_a_drain_must_not_empty(rendered):
    budgets = [d for d in rendered if d["kind"] == "PodDisruptionBudget"]
    covered = {}
    for budget in budgets:
        spec = budget["spec"]
        # A budget that allows no eviction at all would block every node drain.
        assert spec.get("maxUnavailable", 1) >= 1, budget["metadata"]["name"]
        chosen = [n for n, t in pods(rendered).items()
                  if selects(spec["selector"], t["metadata"]["labels"])]  # fmt: skip
        assert len(chosen) == 1, (budget["metadata"]["name"], chosen)
        covered[chosen[0]] = spec
    assert set(covered) == {
        "laneway-web",
        "laneway-proxy",
        "laneway-worker-cpu",
        "laneway-worker-interactive",
    }
    fixed = {d["metadata"]["name"]: d["spec"].get("replicas", 1) for d in rendered
             if d["kind"] == "Deployment"}  # fmt: skip
    for name, spec in covered.items():
        if "minAvailable" in spec:  # fewer replicas than that would block every drain
            assert fixed[name] > spec["minAvailable"], name


def test_every_worker_pod_serves_the_metrics_its_monitors_scrape(rendered):
    config = next(d for d in rendered if d["kind"] == "ConfigMap" and
                  d["metadata"]["name"] == "laneway-settings")["data"]  # fmt: skip
    port = int(config["LANEWAY_WORKER_METRICS_PORT"])
    operator = list(yaml.safe_load_all((ROOT / "deploy/monitoring/operator.yaml").read_text()))
    (monitor,) = [d for d in operator if d["kind"] == "PodMonitor"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    scraped = set()
    for name, template in pods(rendered).items():
        labels = template["metadata"]["labels"]
        annotations = template["metadata"].get("annotations", {})
        (container,) = template["spec"]["containers"]
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        if selects(monitor["spec"]["selector"], labels):
            scraped.add(name)
            assert ports[endpoint["port"]] == port, name
            assert annotations["prometheus.io/scrape"] == "true", name
            assert annotations["prometheus.io/port"] == str(port), name
            assert annotations["prometheus.io/path"] == endpoint["path"] == "/metrics", name
        else:
            assert "metrics" not in ports and not annotations.get("prometheus.io/scrape"), name
    assert scraped == WORKERS


def test_the_production_overlay_sets_what_an_sre_tunes():
    docs = {
        (d["kind"], d["metadata"]["name"]): d for d in render(ROOT / "deploy/overlays/production")
    }
    gpu = docs[("Deployment", "laneway-worker-gpu")]["spec"]["template"]["spec"]
    assert gpu["nodeSelector"] and gpu["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert gpu["containers"][0]["image"].startswith("registry.example.com/laneway-cuda:")
    assert docs[("Deployment", "laneway-web")]["spec"]["replicas"] == 3
    cpu = docs[("Deployment", "laneway-worker-cpu")]["spec"]["template"]["spec"]["containers"][0]
    threads = {e["name"]: e["value"] for e in cpu["env"]}["LANEWAY_TORCH_THREADS"]
    assert threads == cpu["resources"]["requests"]["cpu"]  # a thread per core requested
    assert docs[("HorizontalPodAutoscaler", "laneway-worker-cpu")]["spec"]["minReplicas"] == 3
    assert {d["metadata"].get("namespace") for d in docs.values()} == {"laneway"}
