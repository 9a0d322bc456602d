PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.install.stamp
# Every dependency, direct or not, at the version the tests passed with (make lock refreshes it).
LOCK   := constraints.txt

# Prefer python3.11 for the venv unless PYTHON is given (make PYTHON=python3.12 venv).
ifeq ($(origin PYTHON),file)
PY := $(shell command -v python3.11 >/dev/null 2>&1 && echo python3.11 || echo $(PYTHON))
else
PY := $(PYTHON)
endif

.PHONY: venv test check lint typecheck run demo bench clean lock

venv: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	# dev: the web app, the local stack, tests, lint; at the locked versions
	$(BIN)/python -m pip install -c $(LOCK) -e '.[dev]'
	touch $(STAMP)

# After changing a dependency in pyproject.toml: resolve every extra again, for every platform.
lock:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv
	$(BIN)/uv pip compile pyproject.toml --all-extras --python-version 3.11 --universal \
		--custom-compile-command "make lock" -o $(LOCK)

lint: venv
	$(BIN)/ruff check .

typecheck: venv
	$(BIN)/mypy

# The whole suite, two pytest-xdist workers per core (an idle worker takes tests from a busy
# one): most of its time is spent waiting on real processes (leases running out, workers
# polling, pages loading), not on the CPU; on 2 cores -n 4 took 4:16 where -n 2 took 5:10.
# At most 8: each has a Redis database of its own, counted down from 15 (tests/django_env.py).
TEST_WORKERS ?= $(shell n=$$(( 2 * $$(nproc 2>/dev/null || echo 1) )); echo $$(( n > 8 ? 8 : n )))

# The static checks run beside the tests (mypy alone takes half a minute without its cache, time
# the tests mostly spend waiting on processes); both must pass, the checks' output comes first.
test: venv
	@( $(BIN)/ruff check . && $(BIN)/mypy && $(BIN)/lint-imports ) > .static-checks.log 2>&1 & \
	checks=$$!; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=25; tests=$$?; \
	wait $$checks; static=$$?; cat .static-checks.log; rm -f .static-checks.log; \
	[ $$static -eq 0 ] || echo "make test: ruff, mypy or lint-imports failed (above)"; \
	[ $$static -eq 0 ] && [ $$tests -eq 0 ]

# The fast lane, about a minute: lint, types, layers, and the tests that run in this process.
check: venv
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest tests/core tests/agents -m "not slow" -n auto -q

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
