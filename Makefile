PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.install.stamp

# Prefer python3.11 for the venv unless PYTHON is given (make PYTHON=python3.12 venv).
ifeq ($(origin PYTHON),file)
PY := $(shell command -v python3.11 >/dev/null 2>&1 && echo python3.11 || echo $(PYTHON))
else
PY := $(PYTHON)
endif

.PHONY: venv test lint typecheck run demo bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[dev]'  # dev: the web app, the local stack, tests, lint
	touch $(STAMP)

lint: venv
	$(BIN)/ruff check .

typecheck: venv
	$(BIN)/mypy

test: venv
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest

run: venv
	$(BIN)/python tools/run_dev.py

demo: venv
	$(BIN)/python -m agents.demo

bench: venv
	$(BIN)/python bench/p1_overhead.py
	$(BIN)/python bench/p3_latency.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
