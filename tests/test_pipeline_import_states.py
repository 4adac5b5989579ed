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
    assert runs == []  # refused before its run was made (it was a FAILED run)
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
    # the config of another task (the default data=regression) is refused before any run, naming both
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
    assert statuses == ["FINISHED"]  # the refused import made no run


def _imports(client, export_run):
    return client.search_runs([client.get_run(export_run).info.experiment_id],
                              "tags.`ortflow.stage` = 'import_states'")


def test_an_import_is_checked_before_its_run_is_made(chain, compose_pipeline, tmp_path, capsys):
    """Issue 45, item 5 and weak results: the override guard of the stages, a missing state, the same state given
    twice, a malformed state or manifest, another problem's config: each refused in one line with status 2,
    before any run is made, nothing registered (a missing state used to leave a FAILED run; a malformed manifest
    a traceback and status 1; another problem's config registered a version logging that problem's settings)."""
    overrides, client, export_run, split = chain
    package = _package(export_run, tmp_path)
    good = tmp_path / "good.state"
    good.write_bytes(train_package(package, split.X_train[:40], split.y_train[:40], epochs=1, seed=1).to_bytes())
    garbage = tmp_path / "garbage.state"
    garbage.write_bytes(good.read_bytes()[:7] + b"\xff" * 9)

    def refused(*argv, model_args=("--version", "1")) -> str:
        with pytest.raises(SystemExit) as stopped:
            main([*model_args, *argv])
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and "Traceback" not in err, err
        return next(line for line in err.splitlines() if line.startswith("ortflow: error"))

    assert "UnsafeOverrideError" in refused(str(good), *overrides, "experiment=../../conf/experiment/smoke")
    assert "UnsafeOverrideError" in refused(str(good), *overrides, "+hydra.callbacks.x._target_=shutil.copyfile")
    assert "'missing.state' does not exist" in refused("missing.state", *overrides)
    line = refused(str(good), str(good), *overrides)
    assert f"{str(good)!r} is the same state as {str(good)!r}" in line
    assert f"the state {str(garbage)!r}" in refused(str(garbage), *overrides)
    # the default problem (data=regression, model=linear...) with the smoke chain's MLP version: another problem
    line = refused(str(good), *overrides[1:], "--model", MODEL, model_args=("--version", "1"))
    assert "was trained on another problem" in line and "model.name=mlp_regressor (source run) but" in line
    # a malformed manifest in the version's artifact store
    artifacts = Path(client.get_run(export_run).info.artifact_uri.removeprefix("file://"))
    manifest = artifacts / "training_package" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"tensors"', '"tensors_"', 1).replace('"shape"', '"shape": '
                                                                                              '"x", "_s"', 1))
    assert "the training package of version 1" in refused(str(good), *overrides)
    assert _imports(client, export_run) == []
    assert [str(v.version) for v in client.search_model_versions(f"name='{MODEL}'")] == ["1"]


def test_the_lineage_keeps_every_state_under_its_own_name(chain, compose_pipeline, tmp_path):
    """Issue 45, item 6: two states of the same file name from two folders left one file under ``states/``, a
    path holding ``=`` was taken as an override; now each state is logged under a name of its own, the full list
    is an artifact and the tag stays valid JSON."""
    overrides, client, export_run, split = chain
    package = _package(export_run, tmp_path)
    files = []
    for k, folder in enumerate(["a", "b", "c=d"]):
        (tmp_path / folder).mkdir()
        files.append(tmp_path / folder / "client.state")
        files[-1].write_bytes(train_package(package, split.X_train[k::3], split.y_train[k::3], epochs=1,
                                            seed=k).to_bytes())
    metrics = import_states(compose_pipeline(*overrides, "promotion.register=always"), MODEL, "1", files,
                            work_dir=tmp_path / "import")
    run = client.get_run(metrics["run_id"])
    logged = sorted(a.path for a in client.list_artifacts(run.info.run_id, "states"))
    assert logged == ["states/0-client.state", "states/1-client.state", "states/2-client.state"]
    listing = json.loads(Path(mlflow.artifacts.download_artifacts(
        run_id=run.info.run_id, artifact_path="lineage/states.json", dst_path=str(tmp_path / "l"))).read_text())
    assert [r["sha256"] for r in listing] == [r["sha256"] for r in json.loads(run.data.tags["ortflow.lineage.states"])]
    assert len({r["sha256"] for r in listing}) == 3 and run.data.tags["ortflow.lineage.states_count"] == "3"
    from pipelines.import_states import split_arguments
    assert split_arguments([str(files[2]), "experiment=smoke"]) == (["experiment=smoke"], [str(files[2])])


def test_the_states_tag_is_bounded_and_valid_json():
    """Issue 45, item 6: with 100 states the tag was cut at 4,900 characters and was no longer JSON."""
    from pipelines.import_states import TAG_LIMIT, states_tags

    record = [{"file": f"client-{k:03d}.state", "artifact": f"states/{k:03d}-client-{k:03d}.state",
               "sha256": f"{k:064x}", "rows": 10, "epochs": 1, "steps": 1} for k in range(100)]
    tags = states_tags(record)
    shown = json.loads(tags["ortflow.lineage.states"])
    assert len(tags["ortflow.lineage.states"]) <= TAG_LIMIT and shown == record[:len(shown)] and len(shown) > 0
    assert tags["ortflow.lineage.states_count"] == "100"
    assert tags["ortflow.lineage.states_omitted"].startswith(f"{100 - len(shown)} of 100 states")
    assert "ortflow.lineage.states_omitted" not in states_tags(record[:2])


@pytest.mark.slow
@pytest.mark.parametrize("point, signum, status", [("import_states", "SIGINT", 130),
                                                   ("after_register", "SIGTERM", 143)])
def test_a_signal_during_an_import_leaves_no_run_running_and_no_version(chain, tmp_path, pipeline_subprocess_env,
                                                                        point, signum, status):
    """Issue 45, item 7: SIGTERM to import_states (no handler) left its run RUNNING and a version registered from
    it without its lineage tag; Ctrl-C printed a traceback; each import left a /tmp/ortflow-* folder. Now the run
    ends KILLED, a version registered from it is deleted, one line says so, and the temporary folders go."""
    import signal
    import sys

    from test_reliability_signals import _check_store, _one_line, _signal_at

    overrides, client, export_run, split = chain
    state = tmp_path / "client.state"
    state.write_bytes(train_package(_package(export_run, tmp_path), split.X_train, split.y_train, epochs=1,
                                    seed=3).to_bytes())
    temporary, folder = tmp_path / "tmp", tmp_path / "cmd"
    temporary.mkdir()
    folder.mkdir()
    cmd = [sys.executable, "-m", "pipelines.import_states", "--version", "1", str(state), *overrides,
           "promotion.register=always"]
    code, stderr = _signal_at(point, cmd, dict(pipeline_subprocess_env, TMPDIR=str(temporary)), folder,
                              getattr(signal, signum))
    line = _one_line(code, stderr, status)
    _check_store(client.tracking_uri)
    runs = _imports(client, export_run)
    assert [r.info.status for r in runs] == ["KILLED"] and runs[0].info.run_id in line
    assert [str(v.version) for v in client.search_model_versions(f"name='{MODEL}'")] == ["1"]
    assert [p.name for p in temporary.iterdir() if p.name.startswith("ortflow")] == []
