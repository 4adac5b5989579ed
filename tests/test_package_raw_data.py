"""A registered model's training package takes the rows as the user has them and predicts in the target's units
(issue 47, item 2): the pipelines' standardization sits inside its graphs (the manifest's ``preprocess``), so a
package exported by the chain trains in Node on the raw CSV rows as Python's reference loop does on them.

Tolerances (tests/js_support.py's rule): the weights after ``s`` steps within ``weights_atol``; a prediction moves
by at most ``output_atol`` (standardized units, times the target's scale in its units); a loss ``c * mean(r^2)``
(``r`` the standardized residuals, ``c`` the loss's own factor, read from Python's values) moves by at most
``c * (2 * d * sqrt(mean r^2) + d^2)`` for residuals that move by ``d``, plus the rounding of its float32 mean.
"""

import json
import subprocess
from pathlib import Path

import mlflow
import numpy as np
import onnx
import pandas as pd
import pytest
from mlflow import MlflowClient

from ortflow.graph import editing as g
from ortflow._ort import InferenceSession
from ortflow.package import LOSS_FILE, TrainingPackage, _targets, load_training_state, train_package
from pipelines.data.datasets import Split
from pipelines.execution.bundle import Bundle
from pipelines.import_states import import_states
from pipelines.orchestration.chain import run_chain

from js_support import JS, JS_GROUP, NODE, make_package, node, output_atol, require_node, weights_atol
from tolerances import assert_close, float32_sum_atol

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "node" / "train.mjs"
FEATURES = ["x1", "x2", "x3"]
EPOCHS, SEED = 2, 3


def _table(path: Path) -> Path:
    """A small regression table far from standardized (means in the thousands, scales from 1 to 300)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 3)) * [1.0, 20.0, 300.0] + [5.0, -40.0, 2000.0]
    y = X @ [3.0, 0.5, 0.02] + rng.normal(size=90) + 300.0
    pd.DataFrame(X, columns=FEATURES).assign(target=y).to_csv(path, index=False, float_format="%.9g")
    return path


def _predict(model: bytes, X: np.ndarray) -> np.ndarray:
    session = InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: X})[0].reshape(len(X))


def _loss(package: TrainingPackage, weights: dict, X: np.ndarray, y: np.ndarray) -> float:
    """The loss of ``loss.onnx`` (the package's preprocessing inside) with ``weights`` on the raw rows (X, y)."""
    m = package.record
    model = g.replace_initializers(onnx.load_from_string(package.read(LOSS_FILE)), weights)
    session = InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {m.data_inputs[0].name: X, m.loss_model.label: _targets(m, y, len(y))}
    return float(np.asarray(session.run([m.loss.output], feeds)[0]).mean())


@JS_GROUP
def test_a_pipelines_package_trains_in_node_on_the_raw_csv_rows(compose_pipeline, clean_mlflow_env, tmp_path,
                                                                 sqlite_uri):
    require_node()
    csv = _table(tmp_path / "table.csv")
    overrides = ["data=file", f"data.path={csv}", "data.target=target", "preprocess=none", "model=linear",
                 "trainer.max_iter=3", "trainer.batch_size=16", f"mlflow.tracking_uri={sqlite_uri}",
                 f"mlflow.root={tmp_path}", "promotion.register=always"]
    result = run_chain(compose_pipeline(*overrides), work_dir=tmp_path / "chain")
    client = MlflowClient(sqlite_uri)
    export_run = result.stage_run_ids["export"]
    tags = client.get_run(export_run).data.tags
    assert tags["ortflow.training_package"] == "training_package", tags["ortflow.training_package"]
    split = Split.load(Bundle.from_run(export_run).path("split", "test"))
    folder = mlflow.artifacts.download_artifacts(run_id=export_run, artifact_path="training_package",
                                                 dst_path=str(tmp_path / "package"))
    package = TrainingPackage(folder)
    pre = package.manifest["preprocess"]
    np.testing.assert_array_equal(pre["features"]["mean"], split.x_mean)
    np.testing.assert_array_equal(pre["target"]["mean"], np.float32(split.y_mean))
    assert pre["prediction"] and "standardization" not in package.manifest["metadata"]

    rows = pd.read_csv(csv)
    X, y = rows[FEATURES].to_numpy(np.float32), rows["target"].to_numpy(np.float32)
    X_std = ((X - split.x_mean) / split.x_scale).astype(np.float32)

    # the registered version (the deploy graph, raw rows in) and the package's own prediction graph agree
    registered = mlflow.pyfunc.load_model(f"models:/{tags['ortflow.registered_model']}/"
                                          f"{tags['ortflow.registered_version']}")
    served = np.asarray(registered.predict(rows[FEATURES])["prediction"], dtype=np.float64)
    start = _predict(package.initial_state().trained_onnx_bytes(), X)
    atol = float32_sum_atol(np.abs(start) + abs(split.y_mean) + split.y_scale * np.abs(X_std).sum(axis=1),
                            len(FEATURES) + 4)
    assert_close(start, served, rtol=0.0, atol=atol, err_msg="package vs registered predictions")

    # Python's reference loop and Node (examples/node/train.mjs on the CSV file itself) on the raw rows
    python_epochs = []
    python = train_package(package, X, y, epochs=EPOCHS, seed=SEED, on_epoch=python_epochs.append)
    state, model, history = tmp_path / "node.state", tmp_path / "node.onnx", tmp_path / "node.json"
    node(EXAMPLE, folder, csv, "--header", "--epochs", EPOCHS, "--seed", SEED, "--state", state, "--model", model,
         "--history", history)
    trained = load_training_state(folder, state)
    assert trained.steps == python.steps > 0
    for name, value in python.weights.items():
        np.testing.assert_allclose(trained.weights[name], value, rtol=0,
                                   atol=weights_atol(python.steps, value), err_msg=name)

    # predictions in the target's units, within the derived tolerance of Python's
    expected = _predict(python.trained_onnx_bytes(), X)
    predicted = _predict(model.read_bytes(), X)
    d = output_atol(python, X_std)  # standardized units
    assert_close(predicted, expected, rtol=0.0, atol=d * split.y_scale + float32_sum_atol(
        np.abs(expected) + abs(split.y_mean), 4), err_msg="Node vs Python predictions")
    assert np.abs(predicted - y).mean() < y.std()  # the target's units, not standardized ones

    # the losses: each epoch's, and the trained weights' on all the raw rows (loss.onnx, in Python)
    r = (expected - y) / split.y_scale
    final = _loss(package, python.weights, X, y)
    c = final / float(np.mean(r.astype(np.float64) ** 2))

    def loss_atol(loss: float) -> float:
        return c * (2 * d * np.sqrt(loss / c) + d * d) + float(float32_sum_atol(loss * len(y), len(y))) / len(y)

    assert abs(_loss(package, trained.weights, X, y) - final) <= loss_atol(final)
    node_epochs = json.loads(history.read_text())
    assert [e["epoch"] for e in node_epochs] == [e["epoch"] for e in python_epochs]
    for ours, theirs in zip(node_epochs, python_epochs):
        assert abs(ours["loss"] - theirs["loss"]) <= loss_atol(theirs["loss"]), (ours, theirs)
    assert python_epochs[-1]["loss"] < 1.0  # the standardized scale: the loss the Python trainer reports

    # the Node state back as a version: its deploy graph is Node's trained graph (raw in, raw out), not scaled twice
    metrics = import_states(compose_pipeline(*overrides), tags["ortflow.registered_model"],
                            tags["ortflow.registered_version"], [state], work_dir=tmp_path / "import")
    X_test, y_test = split.raw_X(split.X_test), split.raw_y(split.y_test)
    errors = (_predict(model.read_bytes(), X_test).astype(np.float64) - y_test) ** 2
    # the same graph on the same rows: only the mean's rounding differs
    assert abs(metrics["test_mse"] - errors.mean()) <= float(float32_sum_atol(errors.sum(), len(errors))) / len(errors)


@JS_GROUP
@pytest.mark.parametrize("cell, message", [("", "empty cell"), ("abc", '"abc" is not a finite number')])
def test_the_node_example_refuses_an_empty_or_non_numeric_cell(tmp_path, cell, message):
    """A CSV cell that is not a number is refused with its line and column, never read as 0."""
    require_node()
    folder, _, _ = make_package("linear", "sgd", tmp_path / "package")
    csv = tmp_path / "rows.csv"
    csv.write_text(f"a,b,c,d,e,y\n1,2,3,4,5,6\n1,{cell},3,4,5,6\n")
    done = subprocess.run([NODE, EXAMPLE, folder, csv, "--header"], cwd=JS, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    assert f"line 3, column 2 (b): {message}" in done.stderr, done.stderr
