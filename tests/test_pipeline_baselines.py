"""Honest baselines: the scikit-learn reference evaluate compares with is a converged fit of the same estimator
(its own solver, its class's default iterations), and the under-trained start the chain begins from is logged
under its own name (``start_test_*``, ``model.start_max_iter``, ``start.n_iter``)."""

import math

import numpy as np
import pytest
from mlflow import MlflowClient

from pipelines.data.datasets import Split
from pipelines.modeling.estimators import build_estimator, fit_summary, reference_estimator
from pipelines.modeling.metrics import classification_metrics
from pipelines.orchestration.chain import run_chain


def test_the_reference_is_the_estimator_with_its_class_defaults(compose_pipeline):
    cfg = compose_pipeline("data=iris", "model=logistic", "loss=log", "model.start_max_iter=1")
    start = build_estimator(cfg.model, 0)
    reference = reference_estimator(start)
    assert start.max_iter == 1 and reference.max_iter == 100  # LogisticRegression's default
    assert {k: v for k, v in reference.get_params().items() if k != "max_iter"} == {
        k: v for k, v in start.get_params().items() if k != "max_iter"}  # same solver, C, ...
    mlp = reference_estimator(build_estimator(compose_pipeline("model=mlp_regressor").model, 0))
    assert mlp.max_iter == 200 and mlp.solver == "adam"  # MLPRegressor's defaults
    linear = build_estimator(compose_pipeline("model=linear").model, 0)
    assert reference_estimator(linear).get_params() == linear.get_params()  # solved exactly: no iterations


@pytest.mark.slow
def test_evaluate_logs_the_converged_reference_and_the_start_apart(compose_pipeline, clean_mlflow_env, tmp_path):
    """Seen: ``sklearn_test_*`` scored the start itself (``model.sklearn_max_iter=1``: LogisticRegression after one
    lbfgs iteration), so 'ONNX beats scikit-learn' compared training with an estimator stopped on purpose."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = compose_pipeline("data=iris", "model=logistic", "loss=log", "model.start_max_iter=1",
                           "trainer.max_iter=2", "stages=[convert,add_loss,train,evaluate]",
                           f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path}")
    result = run_chain(cfg, work_dir=tmp_path / "chain")
    client = MlflowClient(uri)
    convert = client.get_run(result.stage_run_ids["convert"])
    params = convert.data.params
    assert params["model.start_max_iter"] == "1" and params["start.n_iter"] == "1"
    assert params["sklearn_reference.max_iter"] == "100" and params["sklearn_reference.solver"] == "lbfgs"
    assert params["sklearn_reference.converged"] == "True" and int(params["sklearn_reference.n_iter"]) < 100
    assert "converged" in convert.data.tags["ortflow.sklearn_reference"]
    assert "model.sklearn_max_iter" not in params

    # the reference's metrics are those of LogisticRegression() fitted here to convergence on the same rows
    split = Split.load(tmp_path / "chain" / "convert" / "split.npz")
    own = reference_estimator(build_estimator(cfg.model, 42)).fit(split.X_train, split.y_train)
    assert fit_summary(own)["converged"]
    expected = classification_metrics(split.y_test, own.predict_proba(split.X_test), split.classes, "sklearn_test_")
    metrics = client.get_run(result.stage_run_ids["evaluate"]).data.metrics
    for key in ("sklearn_test_log_loss", "sklearn_test_accuracy"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-9), key
    # the start is under-trained, and named so
    assert math.isfinite(metrics["start_test_log_loss"])
    assert metrics["start_test_log_loss"] > metrics["sklearn_test_log_loss"] + 0.1
    assert "ortflow.sklearn_baseline" not in client.get_run(result.stage_run_ids["evaluate"]).data.tags
    assert np.isfinite(result.metrics["start_test_accuracy"])
