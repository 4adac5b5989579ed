"""Many writers on one fresh embedded sqlite store (issue: two chains started together on a new mlflow.db crashed
while MLflow created its schema)."""

from __future__ import annotations

import multiprocessing

import pytest
from mlflow import MlflowClient

from pipelines.tracking import setup

WORKERS = 4
ROUNDS = 3


def _setup_at_once(cfg, barrier, results) -> None:
    """One process: wait for the others, then connect to the (new) store as every pipeline entry point does."""
    try:
        barrier.wait(timeout=60)
        setup(cfg)
        results.put("ok")
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        results.put(f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")


def test_processes_starting_together_on_a_new_sqlite_store_all_connect(compose_pipeline, clean_mlflow_env,
                                                                        tmp_path):
    # fork: the workers share the parent's imports and reach setup() within milliseconds of each other, as two
    # `python -m pipelines.main` started together do once their imports are done
    context = multiprocessing.get_context("fork")
    for round_ in range(ROUNDS):
        uri = f"sqlite:///{tmp_path / f'round{round_}' / 'mlflow.db'}"
        cfg = compose_pipeline(f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path / f'round{round_}'}")
        barrier, results = context.Barrier(WORKERS), context.Queue()
        procs = [context.Process(target=_setup_at_once, args=(cfg, barrier, results)) for _ in range(WORKERS)]
        for proc in procs:
            proc.start()
        outcomes = [results.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
        assert outcomes == ["ok"] * WORKERS, (round_, outcomes)
        client = MlflowClient(uri)
        assert [e.name for e in client.search_experiments()].count("ortflow") == 1
        assert client.search_registered_models() == []  # the registry tables exist too
