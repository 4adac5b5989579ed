"""Stage ``convert``: load the data, split it (seeded), fit the scikit-learn model, convert it with ortflow.

Outputs: ``split.npz`` (standardized train/validation/test arrays and the statistics), ``sklearn_reference.npz``
(the scikit-learn model's test predictions, what ``evaluate`` compares with: data, never a pickle) and
``model.onnx`` (the prediction graph training starts from).

    python -m pipelines.convert data=diabetes model=linear
"""

from __future__ import annotations

import json
import time

import numpy as np
import onnx
from omegaconf import DictConfig

import ortflow

from ..data.datasets import Split, make_split
from ..modeling.estimators import build_estimator, build_preprocessing, fit_estimator, sklearn_predict
from ..execution.runner import StageContext


def fitted_estimator(cfg: DictConfig, split: Split, max_iter: int | None = None):
    """The configured scikit-learn model fitted on the training rows (``max_iter`` caps its iterations); on a
    table's raw columns, a Pipeline of the preprocessing (``preprocess``) and the model."""
    estimator = build_estimator(cfg.model, int(cfg.seed))
    if max_iter is not None and "max_iter" in estimator.get_params():
        estimator.set_params(max_iter=max_iter)
    if split.is_table:
        from sklearn.pipeline import make_pipeline

        treatments = {str(k): str(v) for k, v in (cfg.preprocess.get("columns") or {}).items()}
        estimator = make_pipeline(build_preprocessing(split.column_kinds(), treatments), estimator)
    return fit_estimator(estimator, split.X_train, split.y_train, str(cfg.data.task))


def prediction_graph(cfg: DictConfig, estimator, split: Split) -> onnx.ModelProto:
    """The fitted model as the ONNX graph training starts from (a table's: one input per column)."""
    return ortflow.to_onnx(estimator, split.X_train[:1], target_opset=int(cfg.model.target_opset))


def convert(ctx: StageContext) -> dict:
    cfg = ctx.cfg
    begin = time.perf_counter()
    dropped: dict = {}  # what loading a table dropped (data.drop_invalid=true), logged with the feature list
    split = make_split(cfg.data, dropped, cfg.get("preprocess"))
    ctx.log_metrics({"time_load_data_seconds": time.perf_counter() - begin, **split.summary(),
                     **{k: v for k, v in dropped.items() if k.startswith("n_")}})
    features = [str(f) for f in split.feature_names]
    (ctx.work_dir / "features.json").write_text(json.dumps({"features": features, **dropped}, indent=1))
    ctx.log_file(ctx.work_dir / "features.json", "data")
    ctx.set_tags({"ortflow.features": ",".join(features), "ortflow.dropped_columns": dropped.get("dropped_columns")})
    if cfg.mlflow.log_split:
        ctx.log_file(split.save(ctx.work_dir / "split.npz"), "data", entry="split")
    else:  # later stages in this process still find it; a stage run alone needs source.path
        ctx.bundle.add("split", split.save(ctx.work_dir / "split.npz"))

    begin = time.perf_counter()
    estimator = fitted_estimator(cfg, split)
    ctx.log_metrics({"time_sklearn_fit_seconds": time.perf_counter() - begin})
    reference = sklearn_predict(estimator, split.X_test, ctx.task)
    reference = split.raw_y(reference) if ctx.task == "regression" else reference
    np.savez(ctx.work_dir / "sklearn_reference.npz", test_predictions=reference.astype(np.float64),
             split_fingerprint=np.array(split.fingerprint()))
    ctx.log_file(ctx.work_dir / "sklearn_reference.npz", "sklearn", entry="sklearn_reference")

    begin = time.perf_counter()
    onx = prediction_graph(cfg, estimator, split)
    onnx.save(onx, ctx.work_dir / "model.onnx")
    ctx.log_metrics({"time_to_onnx_seconds": time.perf_counter() - begin})
    ctx.log_file(ctx.work_dir / "model.onnx", "graphs", entry="model")
    ctx.set_tags({
        "ortflow.sklearn_model": type(getattr(estimator, "steps", [[None, estimator]])[-1][1]).__name__,
        "ortflow.onnx_outputs": ",".join(o.name for o in onx.graph.output),
        "ortflow.trainable_weights": ",".join(ortflow.trainable_initializers(onx)),
    })
    return ctx.metrics
