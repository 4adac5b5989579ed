# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.install-stamp
EXTRAS ?= cpu,pipelines,test,postgres,torch

.PHONY: install run test bench ui clean server postgres

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

## The main job: the default pipeline on the embedded sqlite MLflow store (./mlflow.db).
run: $(STAMP)
	$(PY) -m pipelines.main $(ARGS)

## The test suite.
test: $(STAMP) postgres
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[$(EXTRAS),bench]"
	$(PY) -m bench.run $(ARGS)

## A team tracking server: PostgreSQL 15 + `mlflow server` with proxied artifacts on 127.0.0.1:$(PORT).
PORT ?= 5000
SERVER_DIR ?= .ortflow/server
server: $(STAMP) postgres
	$(PY) -m pipelines.server --folder $(SERVER_DIR) --port $(PORT)

## PostgreSQL's programs, from the Debian package where they are missing.
postgres:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15)

ui: $(STAMP)
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db --port 5000

clean:
	rm -rf $(VENV) mlruns mlartifacts mlflow.db outputs multirun .ortflow
