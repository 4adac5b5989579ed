"""The chain's registered version carries its training package, and states trained from it come back as a new
version (python -m pipelines.import_states), against a real sqlite MLflow store (issue 38, item 3)."""

import json
from pathlib import Path

import mlflow
import numpy as np
import pytest
from mlflow import MlflowClient

import ortflow
from ortflow.package import TrainingPackage, TrainingState, load_training_state, train_package
from pipelines.data.datasets import Split
from pipelines.execution.bundle import Bundle
from pipelines.import_states import StateImportError, import_states, main
from pipelines.orchestration.chain import run_chain

from js_support import JS_GROUP, node, require_node

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "node" / "train.mjs"

MODEL = "ortflow-smoke-regression-mlp_regressor"


@pytest.fixture
def chain(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri):
    """The smoke chain (full training) registered as version 1; its store, config overrides, export run and split."""
    overrides = ["experiment=smoke", f"mlflow.tracking_uri={sqlite_uri}", f"mlflow.root={tmp_path}"]
    result = run_chain(compose_pipeline(*overrides), work_dir=tmp_path / "chain")
    client = MlflowClient(sqlite_uri)
    export_run = result.stage_run_ids["export"]
    assert client.get_run(export_run).data.tags["ortflow.registered_version"] == "1"
    split = Split.load(Bundle.from_run(export_run).path("split", "test"))
    return overrides, client, export_run, split


def _package(export_run: str, tmp_path: Path) -> TrainingPackage:
    return TrainingPackage(_package_folder(export_run, tmp_path))


def _package_folder(export_run: str, tmp_path: Path) -> str:
    return mlflow.artifacts.download_artifacts(run_id=export_run, artifact_path="training_package",
                                               dst_path=str(tmp_path / "downloaded"))


def _node_state(folder: str, X, y, seed: int, work: Path) -> TrainingState:
    """A state trained by the JavaScript trainer on onnxruntime-node (examples/node/train.mjs), 2 shuffled epochs."""
    data, state = work / f"data{seed}.json", work / f"node{seed}.state"
    data.write_text(json.dumps({"X": np.asarray(X, np.float64).tolist(), "y": np.asarray(y, np.float64).tolist()}))
    node(EXAMPLE, folder, data, "--epochs", "2", "--seed", str(seed), "--state", state)
    return load_training_state(folder, state)


@pytest.mark.parametrize("client_runtime", ["python", pytest.param("node", marks=JS_GROUP)])
def test_the_registered_version_has_a_package_and_imported_states_are_averaged(chain, compose_pipeline, tmp_path,
                                                                               client_runtime):
    overrides, client, export_run, split = chain
    folder = _package_folder(export_run, tmp_path)
    package = TrainingPackage(folder)
    assert client.get_run(export_run).data.tags["ortflow.training_package"] == "training_package"
    trained = Path(mlflow.artifacts.download_artifacts(run_id=_train_run(client, export_run), artifact_path="graphs"))
    registered = ortflow.get_initializers(ortflow.load_model(trained / "trained_model.onnx"))
    start = package.initial_state()
    for name, value in start.weights.items():  # the package starts from the registered weights
        np.testing.assert_array_equal(value, registered[name], err_msg=name)
    manifest = package.manifest
    assert manifest["batch_size"] == 32 and manifest["feature_names"] == [f"x{i}" for i in range(5)]
    np.testing.assert_array_equal(manifest["preprocess"]["features"]["mean"], split.x_mean)  # inside the graphs

    # two clients on parts of the raw training rows: Node's JavaScript trainer, or Python's reference loop
    half = len(split.X_train) // 3
    X_raw, y_raw = split.raw_X(split.X_train), split.raw_y(split.y_train)
    parts = [(X_raw[:half], y_raw[:half]), (X_raw[half:], y_raw[half:])]
    if client_runtime == "node":
        require_node()
        states = [_node_state(folder, X, y, k, tmp_path) for k, (X, y) in enumerate(parts)]
    else:
        states = [train_package(package, X, y, epochs=2, seed=k) for k, (X, y) in enumerate(parts)]
    files = []
    for k, state in enumerate(states):
        files.append(tmp_path / f"client{k}.state")
        files[-1].write_bytes(state.to_bytes())
    metrics = import_states(compose_pipeline(*overrides, "promotion.register=always"), MODEL, "1", files,
                            work_dir=tmp_path / "import")
    assert metrics["registered_version"] == "2"
    run = client.get_run(metrics["run_id"])
    assert run.info.status == "FINISHED" and np.isfinite(run.data.metrics["test_mse"])
    version = client.get_model_version(MODEL, "2")
    assert version.run_id == metrics["run_id"]
    assert version.tags["ortflow.lineage.source_version"] == "1"
    assert version.tags["ortflow.lineage.source_run_id"] == export_run
    record = json.loads(version.tags["ortflow.lineage.states"])
    assert [(r["file"], r["rows"]) for r in record] == [("client0.state", half), ("client1.state",
                                                                                  len(split.X_train) - half)]
    # the new version's package holds the row-weighted mean of the two states
    averaged = _package(metrics["run_id"], tmp_path / "new").initial_state()
    rows = np.array([half, len(split.X_train) - half], dtype=np.float64)
    for name in package.weights:
        expected = (rows[0] * states[0].weights[name].astype(np.float64)
                    + rows[1] * states[1].weights[name].astype(np.float64)) / rows.sum()
        np.testing.assert_allclose(averaged.weights[name], expected, rtol=1e-6, atol=1e-7, err_msg=name)
    assert not np.allclose(averaged.weights["coef_0"], start.weights["coef_0"])


def _train_run(client, export_run: str) -> str:
    parent = client.get_run(export_run).data.tags["mlflow.parentRunId"]
    runs = client.search_runs([client.get_run(export_run).info.experiment_id],
                              f"tags.mlflow.parentRunId = '{parent}' and tags.`ortflow.stage` = 'train'")
    return runs[0].info.run_id


def test_a_bad_state_fails_the_run_and_registers_nothing(chain, compose_pipeline, tmp_path, capsys):
    overrides, client, export_run, split = chain
    package = _package(export_run, tmp_path)
    state = train_package(package, split.X_train, split.y_train, epochs=1, shuffle=False)
    state.tensors["coef_0"][0, 0] = np.nan
    bad = tmp_path / "bad.state"
    bad.write_bytes(state.to_bytes())
    with pytest.raises(SystemExit) as stopped:
        main(["--version", "1", str(bad), *overrides, "promotion.register=always"])
    assert stopped.value.code == 2
    assert "tensor 'coef_0' holds 1 non-finite value" in capsys.readouterr().err
    runs = client.search_runs([client.get_run(export_run).info.experiment_id],
                              "tags.`ortflow.stage` = 'import_states'")
    assert [r.info.status for r in runs] == ["FAILED"]
    assert "non-finite" in runs[0].data.tags["ortflow.failure_reason"]
    assert [str(v.version) for v in client.search_model_versions(f"name='{MODEL}'")] == ["1"]


def test_a_classifiers_package_trains_on_its_labels_and_comes_back(compose_pipeline, clean_mlflow_env, tmp_path,
                                                                   sqlite_uri):
    """iris (three classes, logistic regression): the package carries the classes and one-hot encodes the labels;
    a state trained on them is registered with its test accuracy."""
    overrides = ["experiment=iris_logistic", f"mlflow.tracking_uri={sqlite_uri}", f"mlflow.root={tmp_path}",
                 "promotion.register=always"]
    result = run_chain(compose_pipeline(*overrides), work_dir=tmp_path / "chain")
    client = MlflowClient(sqlite_uri)
    export_run = result.stage_run_ids["export"]
    name = client.get_run(export_run).data.tags["ortflow.registered_model"]
    package = _package(export_run, tmp_path)
    assert package.manifest["target"]["classes"] == [0, 1, 2]
    assert package.manifest["target"]["encoding"] == "one_hot"
    split = Split.load(Bundle.from_run(export_run).path("split", "test"))
    state = train_package(package, split.raw_X(split.X_train), split.y_train, epochs=3, seed=5)
    (tmp_path / "iris.state").write_bytes(state.to_bytes())
    # the config of another task (the default data=regression) is refused inside the run, naming both
    with pytest.raises(StateImportError, match="is a classification model but the config says data.task=regression"):
        import_states(compose_pipeline(*overrides[1:]), name, "1", [tmp_path / "iris.state"],
                      work_dir=tmp_path / "refused")
    metrics = import_states(compose_pipeline(*overrides), name, "1", [tmp_path / "iris.state"],
                            work_dir=tmp_path / "import")
    assert metrics["registered_version"] == "2" and 0.5 < metrics["test_accuracy"] <= 1.0
    version = client.get_model_version(name, "2")
    assert json.loads(version.tags["ortflow.lineage.states"])[0]["rows"] == len(split.X_train)
    experiments = [e.experiment_id for e in client.search_experiments()]  # the refused run: the default one's
    statuses = [r.info.status for r in client.search_runs(experiments, "tags.`ortflow.stage` = 'import_states'",
                                                          order_by=["attributes.start_time ASC"])]
    assert statuses == ["FAILED", "FINISHED"]
