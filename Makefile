# The README's commands. Everything runs in a local virtualenv, created on demand.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
FAST_MARKERS := not postgres and not redis and not rabbitmq and not soak and not restarts

.PHONY: all install constraints demo test test-fast lint format soak bench bench-prefect-venv clean

all: lint test

# The exact versions of constraints.txt; pyproject.toml declares only ranges.
$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# After changing a dependency in pyproject.toml: resolve it in the venv without the old
# pins (`$(PY) -m pip install -e '.[dev]'`), run the tests, then pin what is installed.
constraints:
	{ echo "# Exact versions of every package the dev virtualenv installs (pip install -e '.[dev]'),"; \
	  echo "# used by make, CI and the Docker image: pip install -c constraints.txt ..."; \
	  echo "# Regenerate with \`make constraints\` after a dependency change (see the Makefile)."; \
	  $(PY) -m pip freeze --exclude-editable; } > constraints.txt

BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# Prefect 3 for bench.prefect_loop, in a virtualenv of its own: prefect 3.9.1 requires
# fastapi<0.151, the harness fastapi>=0.163, so pip resolves no dev venv with both.
# Its exact versions: bench/prefect-constraints.txt (pip freeze of this venv).
PREFECT_VENV ?= .venv-prefect
PREFECT_STAMP := $(PREFECT_VENV)/.installed-stamp
$(PREFECT_STAMP): bench/prefect-constraints.txt
	python3 -m venv $(PREFECT_VENV)
	$(PREFECT_VENV)/bin/python -m pip install --quiet -c bench/prefect-constraints.txt prefect
	touch $(PREFECT_STAMP)

bench-prefect-venv: $(PREFECT_STAMP)

demo: install
	$(VENV)/bin/harness demo

# Three processes (pytest-xdist, one test file each at a time, each on services of
# its own: tests/services.py), then the tests that restart a shared service, alone.
# Three on two cores: much of a test with real workers is waiting on them (the
# suite's CPU time is about 60% of two cores' worth of its wall time at -n 2).
# Exit code 5 is "no test selected" (PYTEST_ARGS naming files without any).
test: install
	$(PY) -m pytest -n 3 --dist loadfile -m "not soak and not restarts" --durations=30 $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PY) -m pytest -m restarts $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The tests that need no service, selected by marker (tests/conftest.py applies them):
# unit and contract tests on SQLite and in memory, in well under two minutes.
test-fast: install
	$(PY) -m pytest -n 2 --dist loadfile tests/unit tests/contract -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

soak: install
	$(PY) -m pytest -m soak $(PYTEST_ARGS)

# Every figure of docs/BENCHMARKS.md, side by side; needs PostgreSQL, Redis, RabbitMQ.
bench: $(BENCH_STAMP) $(PREFECT_STAMP)
	$(PY) -m bench $(BENCH_ARGS)

lint: install
	$(VENV)/bin/ruff check harness tasks tests examples celeryconfig.py
	$(VENV)/bin/ruff format --check harness tasks tests examples celeryconfig.py
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff format harness tasks tests examples celeryconfig.py
	$(VENV)/bin/ruff check --fix harness tasks tests examples celeryconfig.py

clean:
	rm -rf $(VENV) $(PREFECT_VENV) .harness harness.db harness.db-* .pytest_cache .mypy_cache .ruff_cache
