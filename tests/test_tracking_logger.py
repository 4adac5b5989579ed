"""MLflow for library users: ``MlflowLogger`` records a fit made in a notebook (no pipelines, no Hydra) into a real
sqlite store: parameters, per-epoch curves, and the trained graph as an ONNX model with a signature; what the docs
say of ``mlflow.sklearn.log_model``; system metrics sampled at an interval that fits short stages."""

import os

import mlflow
import numpy as np
import pytest
from mlflow import MlflowClient
from sklearn.linear_model import LogisticRegression

from ortflow import OrtGradientOptimizer, add_loss_output, to_onnx
from pipelines.tracking.logger import MlflowLogger


@pytest.fixture
def store(sqlite_uri, tmp_path, clean_mlflow_env, monkeypatch):
    """A sqlite store whose current experiment keeps its artifacts under ``tmp_path`` (the Default experiment's
    would be ./mlruns, in the directory the tests run from)."""
    uri = sqlite_uri
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    experiment = MlflowClient(uri).create_experiment("notebook", artifact_location=str(tmp_path / "artifacts"))
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", experiment)  # restored after the test; set_experiment sets it too
    # MLflow's fluent API prefers the experiment last made active in this process (an in-process pipeline test's,
    # in another store) to MLFLOW_EXPERIMENT_ID: seen as "No Experiment with id=5 exists" when xdist ran a chain
    # test before these in the same worker
    mlflow.set_experiment(experiment_id=experiment)
    try:
        yield uri
    finally:
        mlflow.set_tracking_uri(previous)


def _classifier(classification_data):
    X, y = classification_data
    start = LogisticRegression(max_iter=1).fit(X[:40], y[:40])
    return add_loss_output(to_onnx(start, X[:1]), "log"), X, y


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_logger_records_params_curves_and_the_trained_graph(store, classification_data, tmp_path):
    graph, X, y = _classifier(classification_data)
    logger = MlflowLogger(input_example=X[:3])
    trainer = OrtGradientOptimizer(graph, max_iter=4, learning_rate=0.05, callbacks=[logger])
    trainer.fit(X, y, validation_data=(X[:50], y[:50]))

    client = MlflowClient(store)
    run = client.get_run(logger.run_id_)
    assert run.info.status == "FINISHED" and mlflow.active_run() is None  # its own run, ended
    assert run.info.artifact_uri.startswith(str(tmp_path)) or run.info.artifact_uri.startswith(f"file://{tmp_path}")
    assert run.data.params["trainer"] == "OrtGradientOptimizer"
    assert run.data.params["max_iter"] == "4" and run.data.params["learning_rate"] == "0.05"
    assert run.data.params["model_onnx"].startswith("ModelProto ")
    for key, recorded in (("train_loss", "train_loss"), ("validation_loss", "validation_loss")):
        history = client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in history] == [1, 2, 3, 4]
        assert [m.value for m in history] == [r[recorded] for r in trainer.history_]

    # the trained graph: an ONNX model whose signature is the graph's, answering as the trainer does
    info = logger.model_info_
    assert info is not None and info.flavors.keys() >= {"onnx", "python_function"}
    inputs = info.signature.inputs.to_dict()
    assert inputs == [{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": (-1, X.shape[1])}, "name": "X"}]
    outputs = [o.name for o in trainer.get_trained_onnx().graph.output]
    assert [o["name"] for o in info.signature.outputs.to_dict()] == outputs
    assert {"output_label", "output_probability"} <= set(outputs)
    requirements = mlflow.pyfunc.get_model_dependencies(info.model_uri)
    text = open(requirements).read()
    assert "onnxruntime>=" in text and "onnxruntime-training" not in text
    loaded = mlflow.onnx.load_model(info.model_uri)
    assert loaded.SerializeToString() == trainer.get_trained_onnx().SerializeToString()
    answers = mlflow.pyfunc.load_model(info.model_uri).predict({"X": X[:20]})
    np.testing.assert_array_equal(answers["output_label"], trainer.predict(X[:20]))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_logger_writes_into_the_active_run_and_leaves_it_open(store, classification_data):
    graph, X, y = _classifier(classification_data)
    with mlflow.start_run() as run:
        logger = MlflowLogger(model_name=None)
        OrtGradientOptimizer(graph, max_iter=2, callbacks=[logger]).fit(X, y)
        assert logger.run_id_ == run.info.run_id and mlflow.active_run().info.run_id == run.info.run_id
    data = MlflowClient(store).get_run(run.info.run_id).data
    assert "train_loss" in data.metrics and logger.model_info_ is None


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_logger_ends_a_diverged_fit_failed_without_a_model(store, regression_data):
    from sklearn.linear_model import LinearRegression

    X, y = regression_data
    graph = add_loss_output(to_onnx(LinearRegression().fit(X[:20], y[:20])))
    logger = MlflowLogger()
    trainer = OrtGradientOptimizer(graph, max_iter=5, learning_rate=1e4, batch_size=8, callbacks=[logger],
                                   exc=False)
    trainer.fit(X, y * 1e3)
    assert trainer.diverged_
    run = MlflowClient(store).get_run(logger.run_id_)
    assert run.info.status == "FAILED" and run.data.tags["ortflow.model"] == "not logged: training FAILED"
    assert logger.model_info_ is None


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_mlflow_sklearn_log_model_is_refused_as_the_docs_say(store, regression_data):
    """docs/PIPELINES.md: MLflow's default (skops) format refuses the estimator, which holds an onnx.ModelProto; the
    supported way is the trained graph (MlflowLogger). If MLflow starts accepting it, the docs must change."""
    from sklearn.linear_model import LinearRegression

    X, y = regression_data
    trainer = OrtGradientOptimizer(add_loss_output(to_onnx(LinearRegression().fit(X[:20], y[:20]))), max_iter=1)
    trainer.fit(X, y)
    with mlflow.start_run(), pytest.raises(mlflow.exceptions.MlflowException, match="onnx.onnx_ml_pb2.ModelProto"):
        mlflow.sklearn.log_model(trainer, name="estimator")


def test_system_metrics_are_sampled_at_the_configured_interval(store, tmp_path, monkeypatch):
    """``mlflow.system_metrics_interval`` reaches the run's monitor (MLflow's default, 10 s, outlasts most stages),
    the environment's setting wins, and neither leaks into the runs after."""
    from mlflow.tracking.fluent import run_id_to_system_metrics_monitor

    from pipelines.tracking import runs
    from pipelines.tracking.retries import RetryingClient
    from pipelines.tracking.store import Tracking

    client = RetryingClient(MlflowClient(store))
    experiment = client.create_experiment("system-metrics", artifact_location=str(tmp_path / "system"))
    mlflow.set_experiment(experiment_id=experiment)  # whatever an earlier test of this process made active
    tracking = Tracking(store, client, experiment, "system-metrics", tmp_path, retries=2)
    monkeypatch.delenv(runs.SAMPLING_INTERVAL_ENV, raising=False)
    with runs.stage_run(tracking, "sampled", system_metrics=True, system_metrics_interval=0.5) as run_id:
        assert run_id_to_system_metrics_monitor[run_id].sampling_interval == 0.5
    assert runs.SAMPLING_INTERVAL_ENV not in os.environ
    monkeypatch.setenv(runs.SAMPLING_INTERVAL_ENV, "3")
    with runs.stage_run(tracking, "env wins", system_metrics=True, system_metrics_interval=0.5) as run_id:
        assert run_id_to_system_metrics_monitor[run_id].sampling_interval == 3


def _table_fit_parts(n=60):
    """A library fit on a DataFrame (issue 41 item 2): text with a gap, dates, integers, numbers with gaps,
    prepared by ``ortflow.data.preprocessing`` as the README shows."""
    import pandas as pd
    from sklearn.linear_model import SGDRegressor
    from sklearn.pipeline import make_pipeline

    from ortflow.data.preprocessing import column_kinds, make_preprocessing, prepare_frame

    rng = np.random.default_rng(0)
    raw = pd.DataFrame({"city": rng.choice(["Lyon", "Paris", None], n),
                        "day": pd.date_range("2022-01-01", periods=n),
                        "rooms": rng.integers(1, 5, n),
                        "area": np.where(rng.random(n) < 0.1, np.nan, rng.normal(50, 10, n))})
    y = (raw.rooms * 2 + rng.normal(size=n)).to_numpy(np.float32)
    X = prepare_frame(raw)
    start = make_pipeline(make_preprocessing(column_kinds(X)), SGDRegressor(max_iter=2)).fit(X, y)
    return raw, X, y, add_loss_output(to_onnx(start, X))


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("with_example", [True, False])
def test_logger_on_a_dataframe_logs_a_model_taking_that_frame(store, with_example):
    """``MlflowLogger(input_example=frame)`` crashed at the end of fit ("could not convert string to float:
    'Lyon'") and left the run FINISHED without a model; without an example, the logged model refused the frame
    the trainer took. The model now takes that frame (and the raw one: text gaps, dates as ISO text), answering as
    the trainer does."""
    raw, X, y, graph = _table_fit_parts()
    logger = MlflowLogger(input_example=X[:3] if with_example else None)
    trainer = OrtGradientOptimizer(graph, max_iter=3, callbacks=[logger]).fit(X, y)
    run = MlflowClient(store).get_run(logger.run_id_)
    assert run.info.status == "FINISHED" and logger.model_info_ is not None
    model = mlflow.pyfunc.load_model(logger.model_info_.model_uri)
    assert model.metadata.get_model_info().flavors.keys() >= {"onnx", "python_function"}
    expected = trainer.predict(X).ravel()
    np.testing.assert_array_equal(model.predict(X)["prediction"].to_numpy(np.float32), expected)
    as_text = raw.assign(day=raw["day"].dt.strftime("%Y-%m-%d"))
    np.testing.assert_array_equal(model.predict(as_text)["prediction"].to_numpy(np.float32), expected)
    with pytest.raises(mlflow.exceptions.MlflowException, match="column 'area' row 0: 'big'"):
        model.predict(X.assign(area=["big"] + [1.0] * (len(X) - 1)))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_fit_that_fails_while_logging_ends_its_run_failed(store):
    """A model that cannot be logged (here an example without a column the graph takes) fails the fit with the
    cause, and the run ends FAILED saying why it has no model (it stayed FINISHED)."""
    raw, X, y, graph = _table_fit_parts()
    logger = MlflowLogger(input_example=X[:3].drop(columns=["area"]))
    with pytest.raises(ValueError, match=r"input_example lacks the columns \['area'\]"):
        OrtGradientOptimizer(graph, max_iter=2, callbacks=[logger]).fit(X, y)
    run = MlflowClient(store).get_run(logger.run_id_)
    assert run.info.status == "FAILED" and mlflow.active_run() is None
    assert run.data.tags["ortflow.model"].startswith("not logged: ValueError: input_example lacks the columns")
