# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.install-stamp
EXTRAS ?= cpu,pipelines,test,torch

.PHONY: install run test bench ui clean

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
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[$(EXTRAS),bench]"
	$(PY) -m bench.run $(ARGS)

ui: $(STAMP)
	$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db --port 5000

clean:
	rm -rf $(VENV) mlruns mlartifacts mlflow.db outputs multirun .ortflow
