"""The served model's input checks (issue 41 items 16 and 13), on a model a library fit logs in seconds
(``MlflowLogger`` on a DataFrame: the pipelines' served model, :mod:`pipelines.tracking.serving_model`)."""

import warnings

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient
from sklearn.linear_model import SGDRegressor
from sklearn.pipeline import make_pipeline

from ortflow import OrtGradientOptimizer, add_loss_output, to_onnx
from ortflow.data.preprocessing import column_kinds, make_preprocessing, prepare_frame
from pipelines.tracking.logger import MlflowLogger


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A regressor on a number, a boolean, a text and a date column, logged with the raw frame as its example."""
    folder = tmp_path_factory.mktemp("serving-inputs")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{folder / 'mlflow.db'}")
    try:
        experiment = MlflowClient().create_experiment("serving", artifact_location=str(folder / "artifacts"))
        rng = np.random.default_rng(0)
        raw = pd.DataFrame({"area": rng.normal(50, 10, 40), "garden": rng.random(40) < 0.5,
                            "city": rng.choice(["Lyon", "Paris"], 40),
                            "sold": pd.date_range("2022-01-01", periods=40, freq="D")})
        y = (raw.area / 10 + raw.garden).to_numpy(np.float32)
        X = prepare_frame(raw)
        start = make_pipeline(make_preprocessing(column_kinds(raw)), SGDRegressor(max_iter=2)).fit(X, y)
        logger = MlflowLogger(input_example=raw[:3])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with mlflow.start_run(experiment_id=experiment):
                OrtGradientOptimizer(add_loss_output(to_onnx(start, X)), max_iter=1, callbacks=[logger]).fit(X, y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = mlflow.pyfunc.load_model(logger.model_info_.model_uri)
        yield model, raw, [str(w.message) for w in caught]
    finally:
        mlflow.set_tracking_uri(previous)


def test_loading_the_served_model_asks_for_no_type_hints(served):
    """MLflow warned "Add type hints to the `predict` method" on every load; predict takes a pd.DataFrame hint,
    from which MLflow infers nothing (the signature given stays)."""
    model, raw, messages = served
    assert not [m for m in messages if "type hints" in m], messages
    assert [c["name"] for c in model.metadata.signature.outputs.to_dict()] == ["prediction"]


@pytest.mark.parametrize("column, values, phrase", [
    ("area", [True, False, True], "column 'area' row 0: True, a boolean, not a number"),
    ("garden", [2, 1, 0], "column 'garden' row 0: 2, not a boolean"),
    ("garden", ["yes", True, False], "column 'garden' row 0: 'yes', not a boolean"),
])
def test_a_cell_of_the_wrong_kind_is_refused(served, column, values, phrase):
    """Booleans were read as 1/0 in a number column, and 2 as a boolean: each is now a 400 naming the cell."""
    model, raw, _ = served
    frame = raw[:3].astype(object)
    frame[column] = values
    with pytest.raises(mlflow.exceptions.MlflowException, match=phrase) as info:
        model.predict(frame)
    assert info.value.error_code == "INVALID_PARAMETER_VALUE"
    assert len(model.predict(raw[:3].astype(object))) == 3  # the same rows, of the right kinds, are answered


def test_an_ambiguous_date_is_refused_and_an_iso_date_read(served):
    """Issue 41 item 5: "05/04/2022" was read month-first without a word; it is refused, naming the ISO form."""
    model, raw, _ = served
    frame = raw[:2].astype(object)
    frame["sold"] = ["05/04/2022", "2022-04-05"]
    with pytest.raises(mlflow.exceptions.MlflowException,
                       match=r"column 'sold' row 0: '05/04/2022', an ambiguous date .*YYYY-MM-DD"):
        model.predict(frame)
    frame["sold"] = ["2022-05-04", "2022-04-05"]
    iso = model.predict(frame)["prediction"].to_numpy()
    frame["sold"] = pd.to_datetime(["2022-05-04", "2022-04-05"])
    np.testing.assert_array_equal(model.predict(frame)["prediction"].to_numpy(), iso)


@pytest.mark.parametrize("empty", ["rows", "frame"])
def test_an_empty_request_gets_an_empty_answer(served, empty):
    """No rows failed inside the graph (a Reshape of an empty batch: a 400 with onnxruntime's stack trace)."""
    model, raw, _ = served
    frame = raw[:0] if empty == "rows" else pd.DataFrame({c: [] for c in raw.columns})
    answer = model.predict(frame)
    assert list(answer.columns) == ["prediction"] and len(answer) == 0


def test_a_400_from_the_scoring_server_carries_only_the_models_error(served):
    """MLflow's scoring server (its ``invocations``, what ``mlflow models serve`` runs per request) prefixed the
    model's one-line error with an 11-line repr of the request's DataFrame."""
    from mlflow.pyfunc.scoring_server import invocations

    model, raw, _ = served
    body = raw[:12].astype(object).assign(area=["big"] + [1.0] * 11).to_json(orient="split", index=False)
    with pytest.raises(mlflow.exceptions.MlflowException) as info:
        invocations('{"dataframe_split": ' + body + "}", "application/json", model,
                    model.metadata.get_input_schema())
    message = info.value.message
    assert message.startswith("1 input cells do not fit their column (column 'area' row 0: 'big'")
    assert "\n" not in message and "Failed to predict data" not in message
    assert info.value.get_http_status_code() == 400


def test_registering_prints_none_of_mlflows_own_lines(served, capfd):
    """Issue 41 item 13: MLflow's "Successfully registered model ..." and "Created version ..." came before the
    stage's summary, which says the same; registration is now quiet, and MLflow's output is back on after."""
    from mlflow.utils import logging_utils

    from pipelines.tracking import promotion
    from pipelines.tracking.retries import RetryingClient
    from pipelines.tracking.store import Tracking

    model, _, _ = served
    uri = mlflow.get_tracking_uri()
    client = RetryingClient(MlflowClient(uri))
    run_id = model.metadata.run_id
    experiment = client.get_run(run_id).info.experiment_id
    tracking = Tracking(uri, client, experiment, "serving", None, retries=1)
    candidate = promotion.Candidate("quiet-model", model.metadata.get_model_info().model_uri, run_id, "test_mse",
                                    "minimize", 1.0, "champion", promote=False)
    capfd.readouterr()
    version, _ = promotion.register(tracking, candidate)
    out, err = capfd.readouterr()
    assert version == "1" and client.get_model_version("quiet-model", "1").run_id == run_id
    assert "registered model" not in out + err and "Created version" not in out + err, out + err
    assert logging_utils.MLFLOW_LOGGING_STREAM.enabled
