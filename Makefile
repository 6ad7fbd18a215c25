# One task runner for people and CI. `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= dev,mpi,tensorflow

.PHONY: help install lint test test-fast chaos run quickstart schema bench clean

help:
	@echo "make quickstart  install and run the journey on the embedded platform"
	@echo "make test        install, lint, type-check and run every test (what CI runs)"
	@echo "make test-fast   unit and API tests on SQLite only"
	@echo "make chaos       the chaos soak at full size (300 trainings; report in chaos-report.json)"
	@echo "make lint        ruff check, ruff format --check, mypy, lint-imports"
	@echo "make run         dlaas up on the embedded defaults (http://127.0.0.1:8080)"
	@echo "make schema      regenerate manifests/manifest.schema.json"
	@echo "make bench       run the benchmarks (quick), rows in bench.json"

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/activate
	$(BIN)/pip install --quiet -e ".[$(EXTRAS)]"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo

test: lint
	$(BIN)/pytest -q

test-fast: install
	$(BIN)/pytest -q -m "not integration and not e2e" -k "not postgresql"

chaos: install
	DLAAS_CHAOS_TRAININGS=$${DLAAS_CHAOS_TRAININGS:-300} DLAAS_CHAOS_REPORT=chaos-report.json \
		$(BIN)/pytest tests/chaos -q -s

run: install
	$(BIN)/dlaas up

quickstart: install
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python examples/quickstart.py

schema: install
	$(BIN)/python -m service.domain.manifest > manifests/manifest.schema.json

bench: install
	$(BIN)/python benchmarks/run.py --quick --json bench.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
