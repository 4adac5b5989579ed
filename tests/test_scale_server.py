"""The team set-up: a PostgreSQL-backed ``mlflow server`` (pipelines.server) taking many chains at once, Optuna
workers sharing one study on the same PostgreSQL, and a cluster launcher (submitit, local executor)."""

from __future__ import annotations

import subprocess
import sys

import mlflow
import numpy as np
import optuna
import pandas as pd
import pytest
from mlflow import MlflowClient

from bench.concurrency import audit, chain_env, run_chains

pytestmark = pytest.mark.slow


def _sweep_runs(client, experiment):
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=10000)
    sweeps = [r for r in runs if r.data.tags.get("ortflow.sweep") == "true"]
    return runs, sweeps


def _children(runs, parent_id):
    return [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_id]


def _check_sweep(client, experiment, model, jobs):
    """One FINISHED sweep run over ``jobs`` FINISHED chains of 5 FINISHED stages; only the best chain by the
    optimized (validation) metric is registered, once, and holds @champion; returns (sweep, chains)."""
    runs, sweeps = _sweep_runs(client, experiment)
    assert len(sweeps) == 1, [s.info.run_name for s in sweeps]
    sweep = sweeps[0]
    chains = _children(runs, sweep.info.run_id)
    assert len(chains) == jobs and all(r.info.status == "FINISHED" for r in chains)
    for chain in chains:
        stages = _children(runs, chain.info.run_id)
        assert len(stages) == 5 and all(r.info.status == "FINISHED" for r in stages)
        assert "trainer.learning_rate=" in chain.info.run_name  # trials are named by their overrides
    assert len(runs) == 1 + jobs * 6 and sweep.info.status == "FINISHED"
    best = min(chains, key=lambda r: r.data.metrics["objective"])
    assert sweep.data.metrics["best_objective"] == best.data.metrics["objective"]
    assert best.data.metrics["objective"] == pytest.approx(best.data.metrics["validation_loss"])
    assert sweep.data.tags["ortflow.best_run_id"] == best.info.run_id
    assert sweep.data.params["best.trainer.learning_rate"] == best.data.params["trainer.learning_rate"]
    assert sweep.data.metrics["best_trial_test_mse"] == best.data.metrics["test_mse"]  # reported, not chosen by
    versions = client.search_model_versions(f"name='{model}'")
    assert len(versions) == 1
    assert versions[0].run_id == best.data.tags["ortflow.run.export"]
    assert str(client.get_model_version_by_alias(model, "champion").version) == str(versions[0].version)
    return sweep, chains


def test_chains_at_once_on_the_postgres_server(postgres_server, clean_mlflow_env, tmp_path):
    outcome = run_chains(4, postgres_server.url, tmp_path, "scale-pg", "scale-pg-smoke")
    assert outcome.failed == 0, [o[-3000:] for o in outcome.outputs]
    found = audit(postgres_server.url, "scale-pg", "scale-pg-smoke", 4)
    assert found.problems == [] and found.finished == found.runs == 24
    assert found.metric_points == found.expected_points == 4 * 3 * 3 and found.versions == 4
    # the artifacts went through the server's proxy into its artifacts folder; the champion loads and predicts
    mlflow.set_tracking_uri(postgres_server.url)
    model = mlflow.pyfunc.load_model("models:/scale-pg-smoke@champion")
    X = pd.DataFrame(np.random.default_rng(0).normal(size=(3, 5)), columns=[f"x{i}" for i in range(5)])
    assert model.predict(X)["prediction"].shape == (3,)
    assert any((postgres_server.mlflow.folder / "artifacts").rglob("*.onnx"))


def test_optuna_workers_share_one_study_on_postgres(postgres_server, clean_mlflow_env, tmp_path):
    study, trials, workers = f"study-{tmp_path.name}", 4, 3
    experiment, model = "scale-optuna", "scale-optuna-smoke"
    procs = []
    for i in range(workers):  # each worker in its own folder: nothing shared but the two stores
        folder = tmp_path / f"worker{i}"
        folder.mkdir()
        cmd = [sys.executable, "-m", "pipelines.main", "-m", "hparams_search=optuna", "experiment=smoke",
               f"hydra.sweeper.storage={postgres_server.postgres.optuna_uri}", f"hydra.sweeper.study_name={study}",
               f"hydra.sweeper.n_trials={trials}", "hydra.sweeper.n_jobs=1", f"mlflow.experiment_name={experiment}",
               f"mlflow.registered_model_name={model}", "mlflow.connect_timeout=30"]
        procs.append(subprocess.Popen(cmd, cwd=folder, env=chain_env(postgres_server.url), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * workers, [o[-3000:] for o in outputs]
    loaded = optuna.load_study(study_name=study, storage=postgres_server.postgres.optuna_uri)
    assert len(loaded.trials) == trials  # exactly the trials requested, over all workers
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in loaded.trials)
    client = MlflowClient(postgres_server.url)
    sweep, chains = _check_sweep(client, experiment, model, trials)
    assert sorted(r.data.metrics["objective"] for r in chains) == pytest.approx(sorted(t.value for t in
                                                                                       loaded.trials))
    assert sweep.data.metrics["best_objective"] == pytest.approx(loaded.best_value)
    assert sum("closes sweep run" in o for o in outputs) == workers - 1  # one worker closed it
    artifacts = {f.path for f in client.list_artifacts(sweep.info.run_id, "sweep")}
    assert artifacts == {"sweep/search_space.yaml", "sweep/optimization_results.yaml"}


def test_submitit_launcher_two_jobs_on_postgres(postgres_server, clean_mlflow_env, tmp_path):
    cmd = [sys.executable, "-m", "pipelines.main", "-m", "experiment=smoke", "hydra/launcher=submitit_local",
           "trainer.learning_rate=0.01,0.02", "mlflow.experiment_name=scale-submitit",
           "mlflow.registered_model_name=scale-submitit-smoke", f"hydra.sweep.dir={tmp_path / 'sweep'}",
           "mlflow.connect_timeout=30"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=chain_env(postgres_server.url), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert any((tmp_path / "sweep" / ".submitit").iterdir())  # each job ran in its own submitit process
    _check_sweep(MlflowClient(postgres_server.url), "scale-submitit", "scale-submitit-smoke", 2)


def test_a_dataset_inserted_by_a_concurrent_run_is_linked(postgres_server, clean_mlflow_env, compose_pipeline,
                                                          tmp_path):
    """Seen: one trial of a 3-worker sweep on PostgreSQL failed with a unique-key violation on ``datasets``: MLflow
    looks a dataset up, then inserts it, and another worker inserted the same dataset in between. Injected here: a
    second connection commits the same row just before MLflow's INSERT runs; the stage's inputs are still logged."""
    import sqlalchemy

    from pipelines.data.datasets import Split, make_split
    from pipelines.tracking import setup
    from pipelines.tracking.lineage import log_split_inputs

    uri = postgres_server.postgres.uri  # the server's own database, through MLflow's SQLAlchemy store
    cfg = compose_pipeline(f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path}",
                           "mlflow.experiment_name=dataset-race", "data.name=race")
    tracking = setup(cfg)
    split = Split.load(make_split(cfg.data).save(tmp_path / "split.npz"))
    run_id = tracking.client.create_run(tracking.experiment_id).info.run_id
    engine = tracking.client._tracking_client.store.engine
    other = sqlalchemy.create_engine(engine.url)
    injected = []

    def concurrent_writer(conn, cursor, statement, parameters, context, executemany):
        if not injected and statement.lstrip().upper().startswith("INSERT INTO DATASETS"):
            with other.begin() as writer:  # the other worker's transaction, committed first
                writer.exec_driver_sql(statement, parameters)
            injected.append(statement)

    sqlalchemy.event.listen(engine, "before_cursor_execute", concurrent_writer)
    try:
        contexts = log_split_inputs(tracking, run_id, split, cfg.data, "train")
    finally:
        sqlalchemy.event.remove(engine, "before_cursor_execute", concurrent_writer)
        other.dispose()
    assert injected, "MLflow inserted no dataset: the race was not exercised"
    assert contexts == ["training", "validation"]
    logged = tracking.client.get_run(run_id).inputs.dataset_inputs
    assert sorted(d.dataset.name for d in logged) == ["race-train", "race-validation"]
