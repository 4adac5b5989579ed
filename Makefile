# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
# pyenv's interpreter of a `pythonX.Y` (its install under `pyenv root`), for a name the PATH does not run: pyenv's
# shim answers "pyenv: python3.13: command not found" for a version not selected in this folder
PYENV_PYTHON = $(firstword $(wildcard $(shell pyenv root 2>/dev/null)/versions/$(patsubst python%,%,$(1)).*/bin/$(1)))
ifeq ($(shell $(PYTHON) -c 'print(1)' 2>/dev/null),)
override PYTHON := $(or $(call PYENV_PYTHON,$(PYTHON)),$(PYTHON))
endif
# The onnxruntime build the interpreter supports: onnxruntime-training (extra cpu, in .venv) up to Python 3.12, the
# plain onnxruntime (extra ort, in .venv3<minor>) from 3.13 on, where the training build has no wheel.
PY_MINOR := $(shell $(PYTHON) -c 'import sys; print(sys.version_info[1])' 2>/dev/null)
TRAINING_BUILD := $(filter 9 10 11 12,$(PY_MINOR))
VENV ?= $(if $(TRAINING_BUILD),.venv,.venv3$(PY_MINOR))
PY := $(VENV)/bin/python
# what `make run` installs: the onnxruntime build and the pipelines (RUN_STAMP); what `make test` adds: the test
# tools, PostgreSQL's driver, torch (754 MB) and Ray (240 MB), which the default chain does not use (STAMP)
RUN_STAMP := $(VENV)/.run-stamp
STAMP := $(VENV)/.install-stamp
JS_STAMP := js/node_modules/.stamp
# the editable install puts the clone's folder on the path (setuptools' compat mode) rather than a finder consulted
# after the path: a script run next to the clone (whose folder is named ortflow, without __init__.py) would import
# that folder as an empty namespace package ("cannot import name 'OrtGradientOptimizer' from 'ortflow' (unknown
# location)"); found on the path, the package in the clone wins over the namespace folder
EDITABLE := --config-settings editable_mode=compat
TRAINING_RUN_EXTRAS := cpu,pipelines
PLAIN_RUN_EXTRAS := ort,pipelines
RUN_EXTRAS ?= $(if $(TRAINING_BUILD),$(TRAINING_RUN_EXTRAS),$(PLAIN_RUN_EXTRAS))
TRAINING_EXTRAS := $(TRAINING_RUN_EXTRAS),test,postgres,torch,ray
PLAIN_EXTRAS := $(PLAIN_RUN_EXTRAS),test,postgres
EXTRAS ?= $(if $(TRAINING_BUILD),$(TRAINING_EXTRAS),$(PLAIN_EXTRAS))

.PHONY: install run test test-ort bench ui clean server postgres chromium check-python

## PYTHON runs here (a name pyenv's shim refuses and pyenv has not installed: how to get it, status 2)
check-python:
	@test -n "$(PY_MINOR)" || { echo "make: PYTHON=$(PYTHON) does not run here: install it (pyenv install" \
		"$(patsubst python%,%,$(notdir $(PYTHON))), or your system's package) or name its path" \
		"(PYTHON=/path/to/python3.x)"; exit 2; }

$(RUN_STAMP): pyproject.toml | check-python
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(RUN_EXTRAS)]" $(EDITABLE)
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml | check-python
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]" $(EDITABLE)
	touch $(RUN_STAMP) $(STAMP)

install: $(STAMP)

## The main job: the default pipeline on the embedded sqlite MLflow store (./mlflow.db).
run: $(RUN_STAMP)
	$(PY) -m pipelines.main $(ARGS)

## The test suite, in TEST_WORKERS processes (pytest-xdist; the tests of one shared server or cluster share one,
## tests/conftest.py). TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadgroup)
test: $(STAMP) postgres $(JS_STAMP) chromium
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

## The core tests and one pipeline chain on the plain onnxruntime (newest release) under Python 3.13, in .venv313.
PYTHON313 ?= $(or $(call PYENV_PYTHON,python3.13),python3.13)
VENV_ORT := .venv313
PY_ORT := $(VENV_ORT)/bin/python
STAMP_ORT := $(VENV_ORT)/.install-stamp
NON_CORE := $(wildcard tests/test_pipeline_*.py tests/test_scale_*.py tests/test_js_*.py) tests/test_torch_layer.py \
	tests/test_package_raw_data.py tests/test_import_states_server.py \
	tests/test_bench_smoke.py $(foreach t,faults files promotion resume tracking trust,tests/test_reliability_$(t).py)
CORE_TESTS := tests $(foreach f,$(NON_CORE),--ignore=$(f))
ORT_CHAIN := "tests/test_pipeline_chain.py::test_default_chain_on_sqlite[full]"

ifneq ($(STAMP),$(STAMP_ORT))  # else the rule above makes it (PYTHON is a 3.13 already)
$(STAMP_ORT): pyproject.toml
	test -x $(PY_ORT) || $(PYTHON313) -m venv $(VENV_ORT)
	$(PY_ORT) -m pip install --quiet --upgrade pip
	$(PY_ORT) -m pip install --quiet -e ".[$(PLAIN_EXTRAS)]" $(EDITABLE)
	touch $(STAMP_ORT)
endif

test-ort: $(STAMP_ORT) $(JS_STAMP)
	$(PY_ORT) -c "import ortflow; assert ortflow.backend() == 'plain', ortflow.backend()"
	$(PY_ORT) -m pytest $(XDIST) -m "not slow" $(CORE_TESTS) $(PYTEST_ARGS)
	$(PY_ORT) -m pytest $(ORT_CHAIN) $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[$(EXTRAS),bench]" $(EDITABLE)
	$(PY) -m bench.run $(ARGS)

## A team tracking server: PostgreSQL 15 + `mlflow server` with proxied artifacts on 127.0.0.1:$(PORT)
## (SERVER_ARGS: e.g. --cors-allowed-origins http://host:8000 for pages that log states to it).
PORT ?= 5000
SERVER_DIR ?= .ortflow/server
server: $(STAMP) postgres
	$(PY) -m pipelines.server --folder $(SERVER_DIR) --port $(PORT) $(SERVER_ARGS)

## The JavaScript trainer's packages (js/): onnxruntime-node, onnxruntime-web and puppeteer-core at the lockfile's
## versions. --ignore-scripts: onnxruntime-node's install script downloads CUDA binaries (its CPU binding ships in the
## package). Without npm (no Node) nothing is installed and the JavaScript tests skip.
$(JS_STAMP): js/package.json js/package-lock.json
	@if command -v npm >/dev/null; then cd js && npm ci --ignore-scripts --no-audit --no-fund && touch node_modules/.stamp; \
	else echo "npm not found: the JavaScript trainer's tests (tests/test_js_*.py) will be skipped"; fi

## Debian's chromium for the browser test (tests/test_js_browser.py), where it is missing.
chromium:
	@command -v chromium >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

## PostgreSQL's programs, from the Debian package where they are missing.
postgres:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15)

ui: $(RUN_STAMP)
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db --port 5000

clean:
	rm -rf $(VENV) $(VENV_ORT) mlruns mlartifacts mlflow.db outputs multirun .ortflow
