"""The pipelines as users start them: Hydra CLI, -m sweeps (joblib in parallel, Optuna), ``mlflow run``."""

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

REPO = Path(__file__).resolve().parent.parent
MODEL = "ortflow-smoke-regression-mlp_regressor"


def _run(cmd, cwd, env, timeout=300):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, proc.stdout + proc.stderr


def test_cli_wrong_type_fails_naming_the_key(tmp_path, pipeline_subprocess_env):
    proc, out = _run([sys.executable, "-m", "pipelines.main", "trainer.max_iter=abc"], tmp_path,
                     pipeline_subprocess_env)
    assert proc.returncode == 2
    assert "trainer.max_iter" in out and "could not be converted to Integer" in out
    assert not (tmp_path / "mlflow.db").exists()  # nothing ran


def test_cli_incompatible_choice_fails_before_any_run(tmp_path, pipeline_subprocess_env):
    proc, out = _run([sys.executable, "-m", "pipelines.train", "model=logistic"], tmp_path,
                     pipeline_subprocess_env)
    assert proc.returncode == 2 and "ConfigError" in out and "model=logistic" in out


@pytest.mark.slow
def test_multirun_four_jobs_two_in_parallel_on_sqlite(tmp_path, pipeline_subprocess_env, new_sqlite_store):
    new_sqlite_store(tmp_path / "mlflow.db")  # its schema made (conftest.new_sqlite_store)
    cmd = [sys.executable, "-m", "pipelines.main", "-m", "experiment=smoke",
           "trainer.learning_rate=0.002,0.005,0.01,0.02", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    proc, out = _run(cmd, tmp_path, pipeline_subprocess_env)
    assert proc.returncode == 0, out[-4000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("ortflow").experiment_id
    runs = client.search_runs([experiment], max_results=1000)
    sweeps = [r for r in runs if r.data.tags.get("ortflow.sweep") == "true"]
    assert len(sweeps) == 1 and sweeps[0].info.status == "FINISHED"
    sweep = sweeps[0]
    jobs = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == sweep.info.run_id]
    assert len(jobs) == 4 and all(r.info.status == "FINISHED" for r in jobs)
    assert sorted(r.data.params["trainer.learning_rate"] for r in jobs) == ["0.002", "0.005", "0.01", "0.02"]
    for job in jobs:
        stages = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == job.info.run_id]
        assert len(stages) == 5 and all(r.info.status == "FINISHED" for r in stages)
        assert len(client.get_metric_history(
            next(r for r in stages if r.data.tags["ortflow.stage"] == "train").info.run_id, "train_loss")) == 3
    assert len(runs) == 1 + 4 + 4 * 5  # no run lost, none duplicated
    assert sweep.data.metrics["jobs_finished"] == 4
    assert sweep.data.metrics["best_objective"] == min(r.data.metrics["objective"] for r in jobs)
    # trials register nothing; the sweep registers its best job by the optimized (validation) metric, once
    best = min(jobs, key=lambda r: r.data.metrics["objective"])
    versions = client.search_model_versions(f"name='{MODEL}'")
    assert len(versions) == 1 and versions[0].run_id == best.data.tags["ortflow.run.export"]
    champion = client.get_model_version_by_alias(MODEL, "champion")
    assert champion.version == versions[0].version
    assert sweep.data.tags["ortflow.best_run_id"] == best.info.run_id
    assert sweep.data.params["best.trainer.learning_rate"] == best.data.params["trainer.learning_rate"]
    assert sorted(r.info.run_name for r in jobs) == [f"experiment=smoke trainer.learning_rate={lr}"
                                                     for lr in ("0.002", "0.005", "0.01", "0.02")]
    assert "database is locked" not in out.lower() or "retry" in out.lower()


@pytest.mark.slow
def test_optuna_sweep_minimizes_the_returned_validation_loss(tmp_path, pipeline_subprocess_env, new_sqlite_store):
    new_sqlite_store(tmp_path / "mlflow.db")  # its schema made (conftest.new_sqlite_store)
    cmd = [sys.executable, "-m", "pipelines.main", "-m", "hparams_search=optuna", "experiment=smoke",
           "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=1", "stages=[convert,add_loss,train]",
           # one trial diverges: it must be recorded as FAILED without ending the study
           "hydra.sweeper.params={trainer.learning_rate: 'choice(0.01, 0.02, 1000.0)'}",
           "hydra.sweeper.sampler.n_startup_trials=3"]
    proc, out = _run(cmd, tmp_path, pipeline_subprocess_env)
    assert proc.returncode == 0, out[-4000:]
    # issue 41 item 13: the MLflow UI line once per sweep (with its parent run), not once per job
    assert out.count("ortflow: sweep parent run ") == 1 and "MLflow UI:" not in out, out[-4000:]
    result = yaml.safe_load(next((tmp_path / "multirun").rglob("optimization_results.yaml")).read_text())
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("ortflow").experiment_id], max_results=1000)
    sweep = next(r for r in runs if r.data.tags.get("ortflow.sweep") == "true")
    jobs = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == sweep.info.run_id]
    assert len(jobs) == 3
    finished = [r for r in jobs if r.info.status == "FINISHED"]
    assert finished and all(math.isfinite(r.data.metrics["objective"]) for r in finished)
    assert result["best_value"] == pytest.approx(min(r.data.metrics["objective"] for r in finished))
    for job in jobs:
        if job.data.params["trainer.learning_rate"] == "1000.0":
            assert job.info.status == "FAILED" and "ConvergenceError" in job.data.tags["ortflow.failure_reason"]
    # the sweep run: search space, best parameters, Optuna's results; no export stage ran, so nothing registered
    sweep = client.get_run(sweep.info.run_id)
    assert "trainer.learning_rate: CategoricalDistribution(choices=(0.01, 0.02, 1000.0))" in sweep.data.tags[
        "ortflow.search_space"]
    best = min(finished, key=lambda r: r.data.metrics["objective"])
    assert sweep.data.params["best.trainer.learning_rate"] == best.data.params["trainer.learning_rate"]
    assert {f.path for f in client.list_artifacts(sweep.info.run_id, "sweep")} == {
        "sweep/search_space.yaml", "sweep/optimization_results.yaml"}
    assert sweep.data.tags["ortflow.registered"] == "false (the best trial exported no model)"
    assert client.search_registered_models() == []


@pytest.mark.slow
def test_mlflow_run_local_env_manager(tmp_path, pipeline_subprocess_env, new_sqlite_store):
    """``mlflow run .`` lands where ``python -m pipelines.main`` does (experiment ``ortflow``), not in MLflow's
    Default experiment; given an experiment, the stage logs into mlflow run's own run there."""
    new_sqlite_store(tmp_path / "mlflow.db")  # its schema made (conftest.new_sqlite_store)
    env = dict(pipeline_subprocess_env, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    overrides = f"experiment=smoke trainer=fwbw hydra.run.dir={tmp_path / 'outputs'}"
    cmd = [sys.executable, "-m", "mlflow", "run", str(REPO), "--env-manager", "local", "-P", f"overrides={overrides}"]
    proc, out = _run(cmd, tmp_path, env)
    assert proc.returncode == 0, out[-4000:]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("ortflow").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.params["trainer.name"] == "fwbw"
    stages = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.data.tags["ortflow.stage"] for r in stages) == sorted(
        ["convert", "add_loss", "train", "evaluate", "export"])
    assert "test_mse" in parent.data.metrics
    assert f"ortflow pipeline finished: run {parent.info.run_id}" in out
    # mlflow run's own run stays in Default (MLflow creates it before the project starts), linked both ways
    outer = client.get_run(parent.data.tags["ortflow.mlflow_run"])
    assert outer.info.experiment_id == "0" and outer.info.status == "FINISHED"
    assert outer.data.params["overrides"].strip("'") == overrides
    assert outer.data.tags["ortflow.pipeline_run"] == parent.info.run_id
    assert [r.info.run_id for r in client.search_runs(["0"])] == [outer.info.run_id]
    assert not (tmp_path / "mlruns").exists() and not (REPO / "mlruns" / "0").exists()

    cmd = [sys.executable, "-m", "mlflow", "run", str(REPO), "-e", "convert", "--env-manager", "local",
           "--experiment-name", "mlproject", "-P", f"overrides=experiment=smoke hydra.run.dir={tmp_path / 'c'}"]
    proc, out = _run(cmd, tmp_path, env)
    assert proc.returncode == 0, out[-4000:]
    (convert,) = client.search_runs([client.get_experiment_by_name("mlproject").experiment_id])
    assert convert.data.tags["ortflow.stage"] == "convert" and convert.info.status == "FINISHED"
    assert convert.data.params["overrides"].strip("'").startswith("experiment=smoke")  # mlflow run's own run


@pytest.mark.slow
def test_a_launcher_that_cannot_start_ends_the_sweep_run_failed(tmp_path, pipeline_subprocess_env, new_sqlite_store):
    """Seen: ``-m hydra/launcher=slurm`` where there is no SLURM raised in the launcher's ``launch`` (submitit:
    'Could not detect "srun"'); Hydra calls no callback then, so the sweep's parent run stayed RUNNING for ever,
    and the command printed a 41-line traceback."""
    new_sqlite_store(tmp_path / "mlflow.db")  # its schema made (conftest.new_sqlite_store)
    cmd = [sys.executable, "-m", "pipelines.main", "-m", "experiment=smoke", "trainer.learning_rate=0.01,0.02",
           "hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    proc, out = _run(cmd, tmp_path, pipeline_subprocess_env)
    assert proc.returncode == 2, out[-4000:]
    assert "Traceback" not in out
    errors = [line for line in out.splitlines() if line.startswith("ortflow: error:")]
    assert len(errors) == 1 and 'Could not detect "srun"' in errors[0] and "SlurmLauncher" in errors[0], out
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (sweep,) = client.search_runs([client.get_experiment_by_name("ortflow").experiment_id])
    assert sweep.data.tags["ortflow.sweep"] == "true"
    assert sweep.info.status == "FAILED"
    assert sweep.data.tags["ortflow.failure_reason"].startswith('RuntimeError: Could not detect "srun"')
    assert sweep.info.run_id in errors[0]


@pytest.mark.slow
def test_mlflow_run_takes_the_config_keys_as_parameters(tmp_path, pipeline_subprocess_env, new_sqlite_store):
    """Seen: ``mlflow run . -P trainer.max_iter=5`` was refused (only ``-P overrides="..."`` was taken). Every key of
    the schema and every config group is now a ``-P``; the model follows ``-P data=iris``."""
    new_sqlite_store(tmp_path / "mlflow.db")  # its schema made (conftest.new_sqlite_store)
    env = dict(pipeline_subprocess_env, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    cmd = [sys.executable, "-m", "mlflow", "run", str(REPO), "-e", "convert", "--env-manager", "local",
           "--experiment-name", "mlproject", "-P", "data=iris", "-P", "model.start_max_iter=2",
           "-P", "mlflow.tags.team=ml", "-P", f"overrides=hydra.run.dir={tmp_path / 'c'}"]
    proc, out = _run(cmd, tmp_path, env)
    assert proc.returncode == 0, out[-4000:]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (convert,) = client.search_runs([client.get_experiment_by_name("mlproject").experiment_id])
    assert convert.info.status == "FINISHED" and convert.data.tags["ortflow.stage"] == "convert"
    params = convert.data.params
    assert (params["data.name"], params["model.name"], params["model.start_max_iter"]) == ("iris", "logistic", "2")
    assert params["start.n_iter"] == "2" and convert.data.tags["team"] == "ml"


@pytest.mark.slow
def test_mlflow_run_with_an_unknown_parameter_is_refused_and_its_run_marked(tmp_path, pipeline_subprocess_env,
                                                                            new_sqlite_store):
    """Seen: ``mlflow run . -P <key>=...`` with a key the config does not have left a FAILED run in the Default
    experiment recording it as a parameter, with only the guard's generic refusal of the flag on the console.
    MLflow creates the run before the project starts and gives no way to refuse a key first; a deleted run makes
    mlflow run itself fail (it ends the run after the command)."""
    new_sqlite_store(tmp_path / "mlflow.db")  # its schema made (conftest.new_sqlite_store)
    env = dict(pipeline_subprocess_env, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    cmd = [sys.executable, "-m", "mlflow", "run", str(REPO), "--env-manager", "local", "-P", "trainer.maxiter=5",
           "-P", "overrides=experiment=smoke"]
    proc, out = _run(cmd, tmp_path, env)
    assert proc.returncode != 0
    assert "Traceback" not in out, out[-4000:]
    (line,) = [line for line in out.splitlines() if line.startswith("ortflow: error:")]
    assert "MlflowRunParameterError: mlflow run -P trainer.maxiter=5: 'trainer.maxiter' is not a key" in line
    assert "did you mean trainer.max_iter" in line  # the closest first (trainer.max_time may follow)
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs(["0"])
    assert run.info.run_id in line
    assert run.info.status == "FAILED" and run.info.run_name == "refused-parameters"
    assert run.data.tags["mlflow.note.content"].startswith("Refused before anything ran: MlflowRunParameterError")
    assert run.data.tags["ortflow.failure_reason"].startswith("MlflowRunParameterError: mlflow run -P trainer.maxiter")
    assert client.get_experiment_by_name("ortflow") is None  # nothing ran


_ENTRY_MODULES = sorted(f"pipelines.{p.stem}" if p.stem != "__main__" else "pipelines"
                        for p in (REPO / "pipelines").glob("*.py") if 'if __name__ == "__main__"' in p.read_text())


def test_every_entry_point_answers_help_with_status_0(tmp_path, pipeline_subprocess_env):
    """Seen: ``python -m pipelines --help`` and ``python -m pipelines.mlproject --help`` exited 2 (usage as an
    error), ``python -m pipelines.resend --help`` with a traceback (it read '--help' as a file); the stages all
    showed the same text. Each stage's --help now lists the keys it reads."""
    from pipelines.base.stages import TABLE

    assert {"pipelines", "pipelines.main", "pipelines.mlproject", "pipelines.resend", "pipelines.server"} <= set(
        _ENTRY_MODULES)
    stages = {s.name: s for s in TABLE}
    for module in _ENTRY_MODULES:
        proc, out = _run([sys.executable, "-m", module, "--help"], tmp_path, pipeline_subprocess_env, timeout=120)
        assert proc.returncode == 0, (module, out[-2000:])
        assert "Traceback" not in out and proc.stdout.strip(), module
        name = module.rsplit(".", 1)[-1]
        if name in stages:
            assert f"Keys of stage {name} (python -m pipelines.{name})" in proc.stdout, module
            keys = proc.stdout.split("Keys of stage", 1)[1].split("==", 1)[0]
            for group in stages[name].reads:
                assert f"\n    {group}" in keys, (module, group)
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_the_console_shows_ortflow_lines_not_harmless_third_party_warnings(tmp_path, pipeline_subprocess_env):
    """Seen on a chain's stderr: MLflow's 'Add type hints to the `predict` method' UserWarning three times
    (shown 'once' inside MLflow's own catch_warnings), its INFO lines creating the store's tables and its
    download progress bars, between ortflow's own lines. A classification table with no model= given also runs
    (logistic and log follow data.task), and ortflow's warning about dropped rows still shows."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=120), "b": rng.normal(size=120)})
    frame["label"] = (frame.a + frame.b > 0).astype(int)
    frame.loc[3, "a"] = np.nan
    frame.to_csv(tmp_path / "t.csv", index=False)
    cmd = [sys.executable, "-m", "pipelines.main", "data=file", "data.path=t.csv", "data.target=label",
           "data.task=classification", "data.drop_invalid=true", "preprocess=none", "trainer.max_iter=2"]
    proc, out = _run(cmd, tmp_path, pipeline_subprocess_env)
    assert proc.returncode == 0, out[-4000:]
    assert "t.csv: 1 of 120 rows dropped (missing or non-finite values)" in out  # ortflow's warning (Hydra's log)
    for noise in ("Add type hints", "Warning:", "Creating initial MLflow database tables", "Downloading artifacts"):
        assert noise not in proc.stderr, (noise, proc.stderr[-3000:])
    assert re.search(r"models:/ortflow-t-logistic-label-[0-9a-f]{8}/1", proc.stdout), proc.stdout[-2000:]

    from pipelines.cli import is_harmless

    # what is hidden is known by name; a warning of ortflow or scikit-learn is never hidden
    assert is_harmless("\x1b[33mAdd type hints to the `predict` method", UserWarning,
                       "/x/site-packages/mlflow/pyfunc/utils/data_validation.py")
    assert is_harmless("noload is deprecated", DeprecationWarning, "/x/site-packages/mlflow/store/x.py")
    assert not is_harmless("Stochastic Optimizer: Maximum iterations", UserWarning,
                           "/x/site-packages/sklearn/neural_network/_multilayer_perceptron.py")
    assert not is_harmless("deprecated", DeprecationWarning, str(REPO / "ortflow" / "base.py"))


@pytest.mark.parametrize("fault", ["python", "env-manager"])
def test_mlflow_run_fails_early_when_its_environment_cannot_be_built(fault, tmp_path, pipeline_subprocess_env):
    """Seen: ``mlflow run .`` with the default environment manager tried to download Python 3.11.15 (python_env.yaml
    says 3.11), failed with a 30-line traceback and left a RUNNING run. ``python -m pipelines.mlproject run``
    refuses before any run when pyenv lacks the python_env.yaml's Python (a copy asking for one no pyenv has), and
    when building fails after MLflow made its run (``--env-manager conda`` on a python_env project, refused by
    MLflow after it created the run) ends that run FAILED with the reason: one line and a hint, status 2."""
    import shutil

    from mlflow import MlflowClient

    project = tmp_path / "project"
    project.mkdir()
    root = Path(__file__).resolve().parent.parent
    shutil.copy(root / "MLproject", project / "MLproject")
    env = yaml.safe_load((root / "python_env.yaml").read_text())
    if fault == "python":
        env["python"] = "3.4"  # no pyenv installs it: virtualenv would download and build it
    (project / "python_env.yaml").write_text(yaml.safe_dump(env))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    extra = ["--env-manager", "conda"] if fault == "env-manager" else []
    proc = subprocess.run([sys.executable, "-m", "pipelines.mlproject", "run", str(project), *extra,
                           "-P", "overrides=trainer.max_iter=1"], cwd=tmp_path,
                          env={**pipeline_subprocess_env, "MLFLOW_TRACKING_URI": uri,
                               "MLFLOW_DISABLE_ENV_MANAGER_CONDA_WARNING": "TRUE"}, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr[-3000:]
    [first] = [line for line in proc.stderr.splitlines() if line.startswith("ortflow: error:")]
    assert first.startswith("ortflow: error: EnvironmentBuildError: mlflow run "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "hint: --env-manager local" in proc.stderr
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert not [r for r in runs if r.info.status == "RUNNING"]
    if fault == "python":
        assert "asks for Python 3.4, which pyenv has not installed" in first or "pyenv, which is not installed" in first
        assert "no run was made" in first and runs == []
    else:
        [run] = runs
        assert run.info.status == "FAILED" and "conda" in run.data.tags["mlflow.note.content"]
        assert f"its run {run.info.run_id} ended FAILED" in first
