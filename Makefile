# Laneway: `make demo` runs the main job on the embedded default, `make test` passes the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean chromium screenshots

install: $(STAMP)

# torch goes in first and pinned, so nothing later can pull a CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: install
	HF_HUB_OFFLINE=1 $(BIN)/laneway demo examples/customer_messages.csv

test: install chromium
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The browser tests drive Debian's chromium through Playwright (no browser download).
chromium:
	test -x /usr/bin/chromium || (apt-get update && apt-get install -y chromium)

# docs/screenshots/*.png: each page, taken by the browser test.
screenshots: install chromium
	HF_HUB_OFFLINE=1 LANEWAY_SCREENSHOTS=docs/screenshots $(BIN)/python -m pytest -q tests/e2e/test_browser.py

lint: install
	$(BIN)/ruff check .

bench: install
	HF_HUB_OFFLINE=1 $(BIN)/python bench/throughput.py

clean:
	rm -rf $(VENV) var .pytest_cache
