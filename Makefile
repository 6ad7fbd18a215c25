# One task runner for people and CI. `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= dev,mpi,tensorflow,onnx
comma := ,
# Written by the last install of these extras: newer than pyproject.toml, nothing to reinstall.
INSTALLED := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
# tensorflow-serving-api without its dependencies: it requires `tensorflow`, which would be
# installed over tensorflow-cpu (see pyproject.toml, grpcio).
TF_SERVING_API ?= tensorflow-serving-api==2.21.*
# Debian's Chromium, which the browser tests drive (installed by `make browser`, which
# `make test` runs, if missing; `make quickstart` and `make install` never install it).
CHROMIUM ?= /usr/bin/chromium
# nghttp2's h2load, the gRPC scoring rows' load generator (benchmarks/loadgen.py; its test
# runs in `make test`): Debian's nghttp2-client, installed by `make test` and `make bench`
# if missing.
H2LOAD ?= /usr/bin/h2load
GRPC_FRONT := $(BIN)/dlaas-grpc-front

.PHONY: help install ui-assets browser lint test test-fast chaos run quickstart schema bench clean

help:
	@echo "make quickstart  install and run the journey on the embedded platform"
	@echo "make test        install, lint, type-check and run every test (what CI runs)"
	@echo "make test-fast   unit and API tests on SQLite only"
	@echo "make chaos       the chaos soak at full size (300 trainings; report in chaos-report.json)"
	@echo "make lint        ruff check, ruff format --check, mypy, lint-imports"
	@echo "make run         dlaas up on the embedded defaults (http://127.0.0.1:8080, dashboard /ui/)"
	@echo "make ui-assets   install the dashboard's front-end libraries from npm (npm ci)"
	@echo "make browser     install Debian's Chromium for the browser tests, if missing (make test does)"
	@echo "make schema      regenerate manifests/manifest.schema.json"
	@echo "make bench       run the benchmarks (quick), rows in bench.json"

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Everything in .venv: what `make quickstart` installs, and all it installs.
$(INSTALLED): pyproject.toml | $(BIN)/activate
	$(BIN)/pip install --quiet -e ".[$(EXTRAS)]"
	$(BIN)/pip install --quiet --no-deps "$(TF_SERVING_API)"
	touch $@

install: $(VENV)/.libseccomp $(INSTALLED) ui-assets $(GRPC_FRONT)

# The scoring gRPC port's transport outside Python (service/scoring/grpc_front.py), built
# beside the venv's Python against Debian's gRPC (libgrpc++-dev, installed if missing).
# Where it is not built (`make quickstart` builds nothing), grpcio's server carries the port.
$(GRPC_FRONT): native/grpc_front/front.cc native/grpc_front/build | $(BIN)/activate
	@pkg-config --exists grpc++ 2>/dev/null || { \
		echo "Installing Debian's libgrpc++-dev (apt-get), for the scoring gRPC front"; \
		apt-get update && apt-get install -y --no-install-recommends libgrpc++-dev pkg-config; }
	native/grpc_front/build $@

# The sandbox's seccomp filter is compiled by the system's libseccomp (pyseccomp binds it);
# Debian's apt depends on it, so it is nearly always there. Without it the local tenant's
# trainings run unsandboxed (as the quick start's may), others are refused.
$(VENV)/.libseccomp: | $(BIN)/activate
	@ldconfig -p | grep -q 'libseccomp\.so\.2' || { \
		echo "Installing Debian's libseccomp2 (apt-get), for the sandbox's seccomp filter"; \
		apt-get update && apt-get install -y libseccomp2; }
	@touch $@

# The dashboard's front-end libraries (and the browser tests' accessibility checker), from
# npm as package-lock.json pins them, into node_modules (gitignored); the API serves them
# from there (/ui/vendor/). npm itself is Debian's where it is missing.
ui-assets: node_modules/.installed

node_modules/.installed: package.json package-lock.json
	@command -v npm >/dev/null || { apt-get update && apt-get install -y npm; }
	npm ci --ignore-scripts --no-audit --no-fund
	touch $@

# The browser the dashboard's tests drive (tests/browser): Debian's Chromium, installed
# only where it is missing (Playwright never downloads one).
browser: $(CHROMIUM)

$(CHROMIUM):
	@echo "Installing Debian's Chromium (apt-get, system-wide) for the dashboard's browser tests"
	apt-get update && apt-get install -y chromium

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo

$(H2LOAD):
	@echo "Installing Debian's nghttp2-client (apt-get, system-wide) for h2load"
	apt-get update && apt-get install -y nghttp2-client

test: lint browser $(H2LOAD)
	$(BIN)/pytest -q

test-fast: install $(H2LOAD)
	$(BIN)/pytest -q -m "not integration and not e2e" -k "not postgresql"

chaos: install
	DLAAS_CHAOS_TRAININGS=$${DLAAS_CHAOS_TRAININGS:-300} DLAAS_CHAOS_REPORT=chaos-report.json \
		$(BIN)/pytest tests/chaos -q -s

run: install
	$(BIN)/dlaas up --host 127.0.0.1 --port 8080

# Only what the journey needs, all of it in .venv: no system package, no browser.
quickstart: $(INSTALLED)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python examples/quickstart.py

schema: install
	$(BIN)/python -m service.domain.manifest > manifests/manifest.schema.json

bench: install $(H2LOAD)
	$(BIN)/python benchmarks/run.py --quick --json bench.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
