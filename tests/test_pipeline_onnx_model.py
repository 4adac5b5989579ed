"""``model=onnx``: the user's own ONNX graph through the whole chain (issue 26, item 4).

The graphs are the committed reference networks (tests/data/reference: a LeNet CNN on 1x8x8 digit images, a tiny
transformer on (n, 12) int64 tokens, both exported from PyTorch with raw logits as their only output).
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import onnx
import pandas as pd
import pytest
from mlflow import MlflowClient
from onnx import TensorProto, helper, numpy_helper

from pipelines.base.checks import validate

from pipelines.base.schema import ConfigError
from pipelines.data.datasets import make_split
from pipelines.orchestration.chain import run_chain
from pipelines.orchestration.precheck import check_training_settings

REFERENCE = Path(__file__).resolve().parent / "data" / "reference"
LENET = REFERENCE / "lenet.onnx"
TRANSFORMER = REFERENCE / "transformer.onnx"


def _compose(compose_pipeline, tmp_path, uri, *overrides):
    return compose_pipeline(f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path}", "trainer.max_iter=2",
                            "trainer.verbose=0", *overrides)


def test_array_data_sets_keep_their_shape_and_dtype(compose_pipeline):
    """digits_images: (n, 1, 8, 8) float32 in [0, 1], never standardized; tokens: (n, 12) int64 below 32. The
    split's file keeps them as they are."""
    images = make_split(compose_pipeline("data=digits_images").data)
    assert images.X_train.shape[1:] == (1, 8, 8) and images.X_train.dtype == np.float32
    assert 0.0 <= images.X_train.min() and images.X_train.max() <= 1.0
    assert images.n_features == 64 and len(images.feature_names) == 64 and len(images.x_mean) == 0
    assert images.raw_rows(images.X_test[:3]).shape == (3, 64)
    assert images.classes.tolist() == list(range(10))
    tokens = make_split(compose_pipeline("data=tokens").data)
    assert tokens.X_train.shape[1:] == (12,) and tokens.X_train.dtype == np.int64
    assert tokens.X_train.max() < 32 and tokens.classes.tolist() == [0, 1]


def test_a_graph_without_rules_is_refused_before_any_run_naming_every_node(compose_pipeline, clean_mlflow_env,
                                                                           tmp_path, sqlite_uri):
    """Two ops outside ortflow's gradient rules (CumSum, Sin) between the weight and the logits: one ConfigError
    naming both nodes, before the chain creates a run."""
    w = numpy_helper.from_array(np.full((64, 10), 0.01, dtype=np.float32), "w")
    axis = numpy_helper.from_array(np.array(1, dtype=np.int64), "axis")
    shape = numpy_helper.from_array(np.array([-1, 64], dtype=np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["X", "shape"], ["flat"], name="flatten"),
             helper.make_node("MatMul", ["flat", "w"], ["scores"], name="dense"),
             helper.make_node("CumSum", ["scores", "axis"], ["summed"], name="running_sum"),
             helper.make_node("Sin", ["summed"], ["logits"], name="wave")]
    graph = helper.make_graph(nodes, "no_rules", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                                                 ["N", 1, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
                              [w, axis, shape])
    path = tmp_path / "no_rules.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    cfg = _compose(compose_pipeline, tmp_path, sqlite_uri, "model=onnx", f"model.path={path}", "data=digits_images")
    validate(cfg)
    with pytest.raises(ConfigError) as err:
        run_chain(cfg, work_dir=tmp_path / "chain")
    message = str(err.value)
    assert "'running_sum' (op CumSum)" in message and "'wave' (op Sin)" in message, message
    assert "2 nodes" in message
    assert not MlflowClient(sqlite_uri).search_runs(
        [e.experiment_id for e in MlflowClient(sqlite_uri).search_experiments()])


@pytest.mark.parametrize("overrides, expected", [
    (("data=tokens",), "is FLOAT but the data are int64"),  # the CNN fed tokens
    (("data=iris",), "the data's rows have shape [4]"),
    (("data=digits_images", "model.output=probs"), "model.output='probs' is not an output"),
])
def test_a_graph_that_does_not_fit_the_data_is_refused(compose_pipeline, overrides, expected):
    cfg = compose_pipeline("model=onnx", f"model.path={LENET}", *overrides)
    validate(cfg)
    with pytest.raises(ConfigError) as err:
        check_training_settings(cfg)
    assert expected in str(err.value), err.value


@pytest.mark.parametrize("data", ["data=file", "data=parquet"])
def test_model_onnx_on_a_table_asks_for_the_numeric_path(compose_pipeline, data):
    """A table's raw columns go through a preprocessing fitted with a scikit-learn model, which a graph of one's
    own has not: the config check names preprocess=none (seen with data=parquet: a ConfigError about the graph's
    FLOAT input and float64 data, after reading the table's samples)."""
    overrides = ["model=onnx", f"model.path={LENET}", data, "data.path=t.parquet", "data.target=y"]
    with pytest.raises(ConfigError, match=rf"model=onnx trains on numeric arrays: with {data} use preprocess=none"):
        validate(compose_pipeline(*overrides))
    validate(compose_pipeline(*overrides, "preprocess=none"))


def test_model_onnx_needs_a_readable_path(compose_pipeline, tmp_path):
    with pytest.raises(ConfigError, match="model=onnx needs model.path"):
        validate(compose_pipeline("model=onnx", "data=digits_images"))
    cfg = compose_pipeline("model=onnx", f"model.path={tmp_path / 'nothing.onnx'}", "data=digits_images")
    validate(cfg)
    with pytest.raises(ConfigError, match="model.path=.*no ONNX file"):
        check_training_settings(cfg)


def _served(name):
    return mlflow.pyfunc.load_model(f"models:/{name}@champion")


def test_lenet_chain_registers_a_model_serving_labels_from_raw_images(compose_pipeline, clean_mlflow_env, tmp_path,
                                                                      sqlite_uri):
    """The whole chain on the exported CNN: trained, evaluated (no scikit-learn baseline: tagged not applicable),
    registered; the registered pyfunc answers labels for 64 pixel columns and for (n, 1, 8, 8) arrays alike."""
    cfg = _compose(compose_pipeline, tmp_path, sqlite_uri, "model=onnx", f"model.path={LENET}",
                   "data=digits_images", "trainer.optimizer=adam", "trainer.learning_rate=0.01")
    validate(cfg)
    result = run_chain(cfg, work_dir=tmp_path / "chain")
    m = result.metrics
    assert m["registered_model"] == "ortflow-digits_images-onnx" and m["registered_version"] == "1"
    assert m["test_accuracy"] > 0.5 and not any(k.startswith("sklearn_test_") for k in m)
    client = MlflowClient(sqlite_uri)
    evaluate = client.get_run(result.stage_run_ids["evaluate"])
    assert evaluate.data.tags["ortflow.sklearn_baseline"].startswith("not applicable")
    convert = client.get_run(result.stage_run_ids["convert"])
    assert convert.data.tags["ortflow.onnx_outputs"] == "output_label,output_probability,raw_score"

    mlflow.set_tracking_uri(sqlite_uri)
    model = _served("ortflow-digits_images-onnx")
    split = make_split(cfg.data)
    frame = pd.DataFrame(split.raw_rows(split.X_test[:20]), columns=[str(f) for f in split.feature_names])
    labels = model.predict(frame.sample(frac=1.0, axis=1, random_state=0))  # columns by name, any order
    assert labels.name == "label" and set(labels) <= set(range(10)) and len(labels) == 20
    np.testing.assert_array_equal(model.predict(split.X_test[:20]), labels)
    proba = model.predict(frame, params={"output": "probabilities"})
    np.testing.assert_allclose(proba.filter(like="probability_").sum(axis=1), 1.0, rtol=1e-5)


def test_transformer_chain_on_tokens(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri):
    """Two classes scored by two logits (softmax, not sigmoid) from int64 tokens; served from token columns."""
    cfg = _compose(compose_pipeline, tmp_path, sqlite_uri, "model=onnx", f"model.path={TRANSFORMER}", "data=tokens",
                   "promotion.register=always")
    validate(cfg)
    result = run_chain(cfg, work_dir=tmp_path / "chain")
    assert result.metrics["registered_version"] == "1"
    mlflow.set_tracking_uri(sqlite_uri)
    model = mlflow.pyfunc.load_model(f"models:/ortflow-tokens-onnx/1")
    split = make_split(cfg.data)
    frame = pd.DataFrame(split.X_test[:10], columns=[str(f) for f in split.feature_names])
    assert set(model.predict(frame)) <= {0, 1}
    with pytest.raises(mlflow.exceptions.MlflowException, match="not whole numbers"):
        model.predict(frame.astype(np.float64) + 0.5)


@pytest.mark.slow
def test_mlflow_models_serve_answers_pixel_columns(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri):
    """`mlflow models serve` (pipelines.server.ModelServer, a real process) answers 64 pixel columns, shuffled,
    with the labels the pyfunc gives in process, and a null pixel with a 400 naming it."""
    import json
    import urllib.error
    import urllib.request

    from pipelines.server import ModelServer

    cfg = _compose(compose_pipeline, tmp_path, sqlite_uri, "model=onnx", f"model.path={LENET}",
                   "data=digits_images")
    run_chain(cfg, work_dir=tmp_path / "chain")
    mlflow.set_tracking_uri(sqlite_uri)
    split = make_split(cfg.data)
    frame = pd.DataFrame(split.raw_rows(split.X_test[:8]), columns=[str(f) for f in split.feature_names])
    expected = _served("ortflow-digits_images-onnx").predict(frame).tolist()
    server = ModelServer(tmp_path / "serve", "models:/ortflow-digits_images-onnx@champion", sqlite_uri)
    server.start(timeout=180)

    def post(body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(server.url + "/invocations", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    try:
        shuffled = json.loads(frame.sample(frac=1.0, axis=1, random_state=0).to_json(orient="split", index=False))
        status, answer = post({"dataframe_split": shuffled})
        assert status == 200 and [p["label"] for p in answer["predictions"]] == expected
        bad = frame.copy()
        bad.iloc[2, 5] = None
        status, answer = post({"dataframe_split": json.loads(bad.to_json(orient="split", index=False))})
        assert status == 400 and "column 'pixel_0_5' row 2" in answer["message"]
    finally:
        server.stop()
