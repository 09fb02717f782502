# Laneway: `make demo` runs the main job on the embedded default, `make test` passes the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

install: $(STAMP)

# torch goes in first and pinned, so nothing later can pull a CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: install
	HF_HUB_OFFLINE=1 $(BIN)/laneway demo examples/customer_messages.csv

test: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .

bench: install
	HF_HUB_OFFLINE=1 $(BIN)/python bench/throughput.py

clean:
	rm -rf $(VENV) var .pytest_cache
