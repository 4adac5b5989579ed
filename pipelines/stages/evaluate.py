"""Stage ``evaluate``: test metrics of the trained ONNX model, run by a plain onnxruntime InferenceSession.

The trained graph gets the standardization folded in front (and the target's scale behind), giving
``deploy_model.onnx``, which takes raw features: metrics are computed on the original units, next to the
scikit-learn model's metrics on the same rows (``sklearn_test_*``). Regression: MSE, MAE, R²;
classification: accuracy, log loss, ROC AUC. Plots: predicted vs actual, or ROC curves.

    python -m pipelines.evaluate source.run_id=<train run>
"""

from __future__ import annotations

import json

import joblib
import numpy as np
import onnx
import onnxruntime

from .. import plots
from ..data import Split
from ..metrics import classification_metrics, regression_metrics
from ..models import sklearn_predict, with_scaling
from ..runner import StageContext


def deploy_graph(split: Split, trained: onnx.ModelProto) -> onnx.ModelProto:
    input_name = trained.graph.input[0].name
    output = "variable" if split.task == "regression" else "__none__"
    return with_scaling(trained, split.x_mean, split.x_scale, split.y_mean, split.y_scale, input_name=input_name,
                        output_name=output)


def onnx_predict(session: onnxruntime.InferenceSession, X: np.ndarray, task: str) -> np.ndarray:
    """Regression predictions (first column) or the probability of class 1."""
    feeds = {session.get_inputs()[0].name: X.astype(np.float32)}
    names = [o.name for o in session.get_outputs()]
    if task == "classification":
        proba = session.run(["output_probability"], feeds)[0]
        return np.asarray(proba)[:, 1]
    out = np.asarray(session.run([names[0]], feeds)[0])
    return out.reshape(len(X), -1)[:, 0]


def evaluate(ctx: StageContext) -> dict:
    split = Split.load(ctx.bundle.path("split", ctx.name))
    trained = ctx.bundle.load_onnx("trained_model", ctx.name)
    deploy = deploy_graph(split, trained)
    path = ctx.work_dir / "deploy_model.onnx"
    onnx.save(deploy, path)
    ctx.log_file(path, "graphs", entry="deploy_model")

    session = onnxruntime.InferenceSession(deploy.SerializeToString(), providers=["CPUExecutionProvider"])
    X_raw = split.raw_X(split.X_test)
    predictions = {"onnx": onnx_predict(session, X_raw, split.task)}
    if "sklearn_model" in ctx.bundle:
        estimator = joblib.load(ctx.bundle.path("sklearn_model", ctx.name))
        baseline = sklearn_predict(estimator, split.X_test, split.task)
        predictions["sklearn"] = split.raw_y(baseline) if split.task == "regression" else baseline
    else:
        ctx.set_tags({"ortflow.sklearn_baseline": "missing (no sklearn_model in the source)"})

    metrics: dict[str, float] = {}
    if split.task == "regression":
        y_true = split.raw_y(split.y_test)
        for label, y_pred in predictions.items():
            metrics.update(regression_metrics(y_true, y_pred, "test_" if label == "onnx" else "sklearn_test_"))
        finite = {k: v for k, v in predictions.items() if np.isfinite(v).all()}
        if finite:
            ctx.log_file(plots.predicted_vs_actual(y_true, finite, ctx.work_dir / "plots" / "predicted_vs_actual.png"),
                         "plots")
    else:
        y_true = split.y_test.astype(np.int64)
        for label, proba in predictions.items():
            metrics.update(classification_metrics(y_true, proba, "test_" if label == "onnx" else "sklearn_test_"))
        finite = {k: v for k, v in predictions.items() if np.isfinite(v).all()}
        if finite and len(np.unique(y_true)) == 2:
            ctx.log_file(plots.roc_curves(y_true, finite, ctx.work_dir / "plots" / "roc.png"), "plots")
    ctx.log_metrics(metrics)
    (ctx.work_dir / "evaluation.json").write_text(json.dumps({"task": split.task, "metrics": metrics}, indent=1))
    ctx.log_file(ctx.work_dir / "evaluation.json", None, entry="evaluation")
    return ctx.metrics
