# The README's commands. Everything runs in a local virtualenv, created on demand.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: all install demo test lint format soak bench clean

all: lint test

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

BENCH_STAMP := $(VENV)/.bench-stamp
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

demo: install
	$(VENV)/bin/harness demo

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

soak: install
	$(PY) -m pytest -m soak $(PYTEST_ARGS)

# Every figure of docs/BENCHMARKS.md, side by side; needs PostgreSQL, Redis, RabbitMQ.
bench: $(BENCH_STAMP)
	$(PY) -m bench $(BENCH_ARGS)

lint: install
	$(VENV)/bin/ruff check harness tasks tests examples celeryconfig.py
	$(VENV)/bin/ruff format --check harness tasks tests examples celeryconfig.py
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff format harness tasks tests examples celeryconfig.py
	$(VENV)/bin/ruff check --fix harness tasks tests examples celeryconfig.py

clean:
	rm -rf $(VENV) .harness harness.db harness.db-* .pytest_cache .mypy_cache .ruff_cache
