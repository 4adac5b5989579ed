"""Stage ``evaluate``: test metrics of the trained ONNX model, run by a plain onnxruntime InferenceSession.

The trained graph gets the standardization folded in front (and the target's scale behind), giving
``deploy_model.onnx``, which takes raw features: metrics are computed on the original units, next to those of
the scikit-learn reference (fitted to convergence by ``convert``: ``sklearn_test_*``) and of the start (the
under-trained scikit-learn fit training began from: ``start_test_*``) on the same rows. Regression: MSE, MAE, R²;
classification (any number of classes): accuracy, macro F1, log loss, ROC AUC (one-vs-rest macro for more than two
classes) and, for the ONNX model, precision/recall/F1 of every class. Plots: predicted vs actual, or ROC curves
(one-vs-rest per class for more than two classes) and the confusion matrix. With ``data=parquet`` the test part
streams chunk by chunk (regression metrics from running sums, classification from the rows or, past a million of
them, counts and score histograms: :class:`pipelines.modeling.metrics.StreamedMetrics`),
``n_test`` counts its rows and the plots show its first :data:`pipelines.modeling.streamed.PLOT_ROWS` rows.

    python -m pipelines.evaluate source.run_id=<train run>
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime

from ..modeling import plots
from ..data.datasets import Split
from ..modeling.metrics import classification_metrics, regression_metrics
from ..modeling.estimators import with_mean, with_scaling
from ..modeling.predictions import check_finite_predictions, onnx_predict
from ..modeling.streamed import PREFIX, streamed_test
from ..execution.runner import StageContext




def deploy_graph(split: Split, trained: onnx.ModelProto, model_name: str | None = None) -> onnx.ModelProto:
    """The trained graph taking raw features and answering in the target's units (``model_name``: the config's
    ``model.name``, which says whether the graph outputs a log-link GLM's linear predictor)."""
    from ortflow.package.graphs import PREPROCESS_KEY

    input_name = trained.graph.input[0].name  # a table's graph takes its columns: no standardization in front
    output = "variable" if split.task == "regression" else "__none__"
    if any(e.key == PREPROCESS_KEY for e in trained.metadata_props):  # a training package's: raw data in and out
        return with_mean(trained, model_name) if split.task == "regression" else trained
    scaled = with_scaling(trained, split.x_mean, split.x_scale, split.y_mean, split.y_scale, input_name=input_name,
                          output_name=output)
    return with_mean(scaled, model_name) if split.task == "regression" else scaled  # a GLM answers exp(score)


def sklearn_reference(ctx: StageContext, split: Split) -> dict[str, np.ndarray]:
    """The test predictions ``convert`` wrote (arrays, loaded without pickle): ``{'sklearn': the converged
    reference, 'start': the start}``; a missing one is tagged ``ortflow.sklearn_baseline`` (no file, other test
    rows, or a file written before the reference was fitted to convergence: its one array is the start's)."""
    path = _reference_path(ctx)
    if path is None:
        return {}
    try:
        with np.load(path, allow_pickle=False) as data:
            fingerprint = str(data["split_fingerprint"])
            if "start_test_predictions" in data:
                found = {"sklearn": data["test_predictions"], "start": data["start_test_predictions"]}
            else:  # written before the reference was converged: its predictions were the start's
                found = {"start": data["test_predictions"]}
    except (ValueError, OSError, KeyError) as exc:
        raise ValueError(f"sklearn_reference ({ctx.bundle.origin}): {path.name} is not an .npz of plain arrays "
                         f"(never unpickled): {exc}") from exc
    expected = (len(split.y_test), len(split.classes)) if split.task == "classification" else (len(split.y_test),)
    if fingerprint != split.fingerprint() or any(p.shape != expected for p in found.values()):
        ctx.set_tags({"ortflow.sklearn_baseline": "missing (the reference predictions are for other test rows)"})
        return {}
    if "sklearn" not in found:
        ctx.set_tags({"ortflow.sklearn_baseline": "missing (the source predates the converged reference: only the "
                                                  "start's predictions, logged as start_test_*)"})
    return found


def _reference_path(ctx: StageContext):
    """The ``sklearn_reference`` file ``convert`` wrote; None, tagged ``ortflow.sklearn_baseline``, without one."""
    if "sklearn_reference" in ctx.bundle:
        return ctx.bundle.path("sklearn_reference", ctx.name)
    ctx.set_tags({"ortflow.sklearn_baseline": "not applicable (model=onnx: no scikit-learn model)"
                  if str(ctx.cfg.model.name) == "onnx" else "missing (no sklearn_reference in the source)"})
    return None


def evaluate(ctx: StageContext) -> dict:
    split = Split.load(ctx.bundle.path("split", ctx.name))
    trained = ctx.bundle.load_onnx("trained_model", ctx.name)
    deploy = deploy_graph(split, trained, str(ctx.cfg.model.name))
    path = ctx.work_dir / "deploy_model.onnx"
    onnx.save(deploy, path)
    ctx.log_file(path, "graphs", entry="deploy_model")

    session = onnxruntime.InferenceSession(deploy.SerializeToString(), providers=["CPUExecutionProvider"])
    if split.streamed:  # data=parquet: the test part streamed once; the plots show its first rows
        metrics, y_true, predictions = _streamed_metrics(ctx, split, session)
    else:
        predictions = {"onnx": onnx_predict(session, split.raw_X(split.X_test), split.task)}
        check_finite_predictions(predictions["onnx"], split)
        predictions.update(sklearn_reference(ctx, split))
        y_true = split.raw_y(split.y_test) if split.task == "regression" else split.y_test
        metrics = {**test_metrics(split, predictions), **validation_metrics(split, session)}
    folder = ctx.work_dir / "plots"
    finite = {k: v for k, v in predictions.items() if np.isfinite(v).all()}
    if split.task == "regression":
        if finite:
            ctx.log_file(plots.predicted_vs_actual(y_true, finite, folder / "predicted_vs_actual.png"), "plots")
    else:
        classes = split.classes
        y_pred = classes[np.argmax(predictions["onnx"], axis=1)]
        ctx.log_file(plots.confusion_matrix(y_true, y_pred, classes, folder / "confusion_matrix.png"), "plots")
        if finite and set(np.unique(y_true)) == set(classes):  # every class in the test rows: a curve each
            ctx.log_file(plots.roc_curves(y_true, finite, classes, folder / "roc.png"), "plots")
    ctx.log_metrics(metrics)
    (ctx.work_dir / "evaluation.json").write_text(json.dumps({"task": split.task, "metrics": metrics}, indent=1))
    ctx.log_file(ctx.work_dir / "evaluation.json", None, entry="evaluation")
    return ctx.metrics


def test_metrics(split: Split, predictions: dict[str, np.ndarray]) -> dict[str, float]:
    """The test metrics of each model's predictions of the test part (``predictions``: label -> predictions, the
    labels of :data:`~pipelines.modeling.streamed.PREFIX`), per class for the ONNX model."""
    y_true = split.raw_y(split.y_test) if split.task == "regression" else split.y_test
    metrics = {}
    for label, predicted in predictions.items():
        if split.task == "regression":
            metrics.update(regression_metrics(y_true, predicted, PREFIX[label]))
        else:
            metrics.update(classification_metrics(y_true, predicted, split.classes, PREFIX[label],
                                                  per_class=label == "onnx"))
    return metrics


def validation_metrics(split: Split, session) -> dict[str, float]:
    """The task's metrics of the trained model on the validation rows (``validation_mse``, ``validation_log_loss``...):
    the number every model of a sweep shares, whatever loss each one trains (``validation_loss`` is each one's own
    loss); none without validation rows."""
    if not split.has_validation:
        return {}
    predicted = onnx_predict(session, split.raw_X(split.X_valid), split.task)
    if split.task == "regression":
        return regression_metrics(split.raw_y(split.y_valid), predicted, "validation_")
    return classification_metrics(split.y_valid, predicted, split.classes, "validation_")


def onnx_test_metrics(split: Split, deploy: onnx.ModelProto) -> dict[str, float]:
    """The test metrics of the deploy graph ``deploy`` alone (in memory, or streamed for ``data=parquet``), its
    predictions checked finite."""
    session = onnxruntime.InferenceSession(deploy.SerializeToString(), providers=["CPUExecutionProvider"])

    def predict(X: np.ndarray) -> np.ndarray:
        predicted = onnx_predict(session, X, split.task)
        check_finite_predictions(predicted, split)
        return predicted

    if split.streamed:
        return streamed_test(split, {"onnx": predict}, per_class=("onnx",)).metrics
    return test_metrics(split, {"onnx": predict(split.raw_X(split.X_test))})


def _streamed_metrics(ctx: StageContext, split: Split, session) -> tuple[dict, np.ndarray, dict]:
    """``data=parquet``: the deployable graph's metrics over the whole test part, streamed chunk by chunk (each
    chunk's predictions checked finite), the baselines' from ``convert``; ``(metrics, the first test rows' targets,
    their predictions)`` for the plots."""

    def predict(X: np.ndarray) -> np.ndarray:
        predicted = onnx_predict(session, X, split.task)
        check_finite_predictions(predicted, split)
        return predicted

    scored = streamed_test(split, {"onnx": predict}, per_class=("onnx",))
    metrics = {**scored.metrics, **_streamed_baselines(ctx, split)}
    ctx.log_metrics({"n_test": scored.n_rows})
    return metrics, scored.y_sample, scored.predictions_sample


def _streamed_baselines(ctx: StageContext, split: Split) -> dict[str, float]:
    """The scikit-learn baselines' test metrics ``convert`` computed on the streamed test part (none: tagged)."""
    path = _reference_path(ctx)
    if path is None:
        return {}
    with np.load(path, allow_pickle=False) as data:
        if "test_metrics" not in data or str(data["split_fingerprint"]) != split.fingerprint():
            ctx.set_tags({"ortflow.sklearn_baseline": "missing (the reference metrics are for other test rows)"})
            return {}
        return {k: float(v) for k, v in json.loads(str(data["test_metrics"])).items()}
