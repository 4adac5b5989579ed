"""Trust boundaries, attacked for real: a run on the tracking server planting a pickle or pointing its manifest
outside the runs' artifacts, Hydra overrides that would instantiate arbitrary callables, experiment names that
would put artifacts outside the artifact folder."""

import json
import pickle
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from mlflow import MlflowClient
from sklearn.linear_model import LinearRegression

from ortflow import to_onnx
from pipelines.execution.bundle import Bundle, UntrustedManifestError
from pipelines.data.datasets import Split
from pipelines.overrides import UnsafeOverrideError, check_overrides
from pipelines.execution.runner import execute_stage, prepare
from pipelines.stages.evaluate import evaluate


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory, new_sqlite_store):
    """One sqlite store for the module (conftest.new_sqlite_store)."""
    return new_sqlite_store(tmp_path_factory.mktemp("trust") / "mlflow.db")


def _malicious_pickle(path, marker):
    """A pickle that creates ``marker`` when loaded (``pathlib.Path.touch`` via ``__reduce__``)."""
    import pathlib

    class Touch:
        def __reduce__(self):
            return (pathlib.Path.touch, (pathlib.Path(marker),))

    path.write_bytes(pickle.dumps(Touch()))
    return path


def _split(rng, n=60, d=3) -> Split:
    X = rng.normal(size=(n, d)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5], dtype=np.float32)).astype(np.float32)
    z = np.zeros(0, dtype=np.float32)
    return Split("regression", X[:40], y[:40], X[:0], z, X[40:], y[40:], np.zeros(d, np.float32),
                 np.ones(d, np.float32), 0.0, 1.0, np.array([f"x{i}" for i in range(d)]), np.array([], np.float64))


def _attacker_run(tmp_path, uri, manifest_for, marker):
    """A run holding a real split and trained model, a malicious pickle under the names evaluate used to
    unpickle, and a manifest built by ``manifest_for(run_id)``."""
    split = _split(np.random.default_rng(0))
    files = tmp_path / "attacker"
    files.mkdir(exist_ok=True)
    split.save(files / "split.npz")
    onnx.save(to_onnx(LinearRegression().fit(split.X_train, split.y_train)), files / "trained_model.onnx")
    _malicious_pickle(files / "sklearn_model.joblib", marker)
    _malicious_pickle(files / "sklearn_reference.npz", marker)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("attacker") or client.get_experiment(client.create_experiment(
        "attacker", artifact_location=(tmp_path / "artifacts").as_uri()))
    run_id = client.create_run(experiment.experiment_id).info.run_id
    client.log_artifact(run_id, str(files / "split.npz"), "data")
    client.log_artifact(run_id, str(files / "trained_model.onnx"), "graphs")
    client.log_artifact(run_id, str(files / "sklearn_model.joblib"), "sklearn")
    client.log_artifact(run_id, str(files / "sklearn_reference.npz"), "sklearn")
    (files / "manifest.json").write_text(json.dumps(manifest_for(run_id)))
    client.log_artifact(run_id, str(files / "manifest.json"))
    client.set_terminated(run_id)
    return run_id


def _evaluate_from(compose_pipeline, tmp_path, uri, run_id):
    cfg = compose_pipeline("experiment=smoke", f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path}",
                           f"source.run_id={run_id}")
    return execute_stage("evaluate", evaluate, cfg, prepare(cfg), Bundle.from_source(cfg.source),
                         tmp_path / f"evaluate-{run_id}")


def test_evaluate_never_unpickles_what_a_run_planted(compose_pipeline, clean_mlflow_env, tmp_path, store_uri):
    marker = tmp_path / "code-ran"

    def manifest(run_id):
        return {"split": {"uri": f"runs:/{run_id}/data/split.npz"},
                "trained_model": {"uri": f"runs:/{run_id}/graphs/trained_model.onnx"},
                "sklearn_model": {"uri": f"runs:/{run_id}/sklearn/sklearn_model.joblib"}}  # the old pickle entry

    run_id = _attacker_run(tmp_path, store_uri, manifest, marker)
    result = _evaluate_from(compose_pipeline, tmp_path, store_uri, run_id)
    assert not marker.exists()
    run = MlflowClient(store_uri).get_run(result["run_id"])
    assert run.info.status == "FINISHED" and "test_mse" in run.data.metrics
    assert run.data.tags["ortflow.sklearn_baseline"].startswith("missing")

    # the same pickle under the name of the reference predictions: refused by numpy (allow_pickle=False)
    def manifest_with_reference(run_id):
        return {**manifest(run_id), "sklearn_reference": {"uri": f"runs:/{run_id}/sklearn/sklearn_reference.npz"}}

    run_id = _attacker_run(tmp_path, store_uri, manifest_with_reference, marker)
    with pytest.raises(ValueError, match=r"sklearn_reference \(run \w+\): sklearn_reference.npz is not an .npz of "
                                         r"plain arrays \(never unpickled\)"):
        _evaluate_from(compose_pipeline, tmp_path, store_uri, run_id)
    assert not marker.exists()


OUTSIDE = [
    ("split", "file:///etc/passwd"),
    ("trained_model", "runs:/{run_id}/../../../outside/trained_model.onnx"),
    ("trained_model", "http://127.0.0.1:9/graphs/trained_model.onnx"),
    ("trained_model", "models:/some-model/1"),
    ("split", "runs:/{run_id}/data/other.npz"),
]


def test_manifest_entries_outside_the_runs_artifacts_are_refused_naming_the_entry(
        compose_pipeline, clean_mlflow_env, tmp_path, store_uri):
    for entry, uri in OUTSIDE:
        def manifest(run_id):
            entries = {"split": {"uri": f"runs:/{run_id}/data/split.npz"},
                       "trained_model": {"uri": f"runs:/{run_id}/graphs/trained_model.onnx"}}
            entries[entry] = {"uri": uri.format(run_id=run_id)}
            return entries

        run_id = _attacker_run(tmp_path, store_uri, manifest, tmp_path / "code-ran")
        with pytest.raises(UntrustedManifestError, match=f"manifest entry '{entry}' points at") as info:
            _evaluate_from(compose_pipeline, tmp_path, store_uri, run_id)
        assert f"run {run_id}" in str(info.value) and "nothing was downloaded" in str(info.value)
        assert not (tmp_path / f"evaluate-{run_id}").exists()  # refused before the stage's run was created


def test_mlproject_overrides_cannot_instantiate_arbitrary_callables(tmp_path, pipeline_subprocess_env):
    """The exact injection: ``mlflow run . -e convert -P overrides="+hydra.callbacks.x._target_=shutil.copyfile
    ..."`` runs this command line (MLproject's entry point); the file must not be copied."""
    secret, copy = tmp_path / "secret.txt", tmp_path / "copied.txt"
    secret.write_text("secret")
    overrides = (f"+hydra.callbacks.x._target_=shutil.copyfile +hydra.callbacks.x.src={secret} "
                 f"+hydra.callbacks.x.dst={copy} experiment=smoke hydra.run.dir=out")
    proc = subprocess.run([sys.executable, "-m", "pipelines.mlproject", "convert", overrides], cwd=tmp_path,
                          env=pipeline_subprocess_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "UnsafeOverrideError: override '+hydra.callbacks.x._target_=shutil.copyfile'" in proc.stderr
    assert not copy.exists() and not (tmp_path / "out").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("args, named", [
    (["+hydra.callbacks.x={_target_:shutil.copyfile,src:a,dst:b}"], "edits hydra.callbacks.x"),
    (["~hydra.callbacks.mlflow_sweep"], "edits hydra.callbacks.mlflow_sweep"),
    (["hydra.launcher._target_=os.system"], "_target_='os.system'"),
    (["+trainer.x={_target_:os.system,command:id}"], "_target_='os.system'"),
    (["+trainer.x=[1,{_target_:os.system}]"], "_target_='os.system'"),
    (["hydra.searchpath=[file:///tmp/evil]"], "edits hydra.searchpath"),
    (["experiment=../../../tmp/evil/e"], "not an option name of the config group 'experiment'"),
    (["hydra/launcher=../../evil"], "not an option name of the config group 'hydra/launcher'"),
    (["--config-dir", "/tmp/evil"], "flag '--config-dir'"),
    (["-cd=/tmp/evil"], "flag '-cd'"),
    (["--experimental-rerun", "config.pickle"], "flag '--experimental-rerun'"),
])
def test_unsafe_overrides_are_refused_naming_them(args, named):
    with pytest.raises(UnsafeOverrideError, match=re.escape(named)):
        check_overrides(["experiment=smoke", *args])


def test_ordinary_overrides_and_sweeps_are_accepted():
    check_overrides(["-m", "experiment=smoke", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                     "hparams_search=optuna", "trainer.learning_rate=0.001,0.01", "data.path=../data/x.csv",
                     "source.path=/tmp/folder", "hydra.run.dir=out", "+mlflow.tags.team=a", "--cfg", "job",
                     "--info", "config", "trainer.weights_to_train=[coef_0,intercept_0]", "experiment=null"])
