"""Stage ``convert``: load the data, split it (seeded), fit the scikit-learn model, convert it with ortflow.

Outputs: ``split.npz`` (standardized train/validation/test arrays and the statistics), ``sklearn_model.joblib``
and ``model.onnx`` (the prediction graph training starts from).

    python -m pipelines.convert data=diabetes model=linear
"""

from __future__ import annotations

import time

import joblib
import onnx

import ortflow

from ..data import make_split
from ..models import build_estimator, fit_estimator
from ..runner import StageContext


def convert(ctx: StageContext) -> dict:
    cfg = ctx.cfg
    begin = time.perf_counter()
    split = make_split(cfg.data)
    ctx.log_metrics({"time_load_data_seconds": time.perf_counter() - begin, **split.summary()})
    if cfg.mlflow.log_split:
        ctx.log_file(split.save(ctx.work_dir / "split.npz"), "data", entry="split")
    else:  # later stages in this process still find it; a stage run alone needs source.path
        ctx.bundle.add("split", split.save(ctx.work_dir / "split.npz"))

    begin = time.perf_counter()
    estimator = fit_estimator(build_estimator(cfg.model, int(cfg.seed)), split.X_train, split.y_train, ctx.task)
    ctx.log_metrics({"time_sklearn_fit_seconds": time.perf_counter() - begin})
    joblib.dump(estimator, ctx.work_dir / "sklearn_model.joblib")
    ctx.log_file(ctx.work_dir / "sklearn_model.joblib", "sklearn", entry="sklearn_model")

    begin = time.perf_counter()
    onx = ortflow.to_onnx(estimator, split.X_train[:1], target_opset=int(cfg.model.target_opset))
    onnx.save(onx, ctx.work_dir / "model.onnx")
    ctx.log_metrics({"time_to_onnx_seconds": time.perf_counter() - begin})
    ctx.log_file(ctx.work_dir / "model.onnx", "graphs", entry="model")
    ctx.set_tags({
        "ortflow.sklearn_model": type(estimator).__name__,
        "ortflow.onnx_outputs": ",".join(o.name for o in onx.graph.output),
        "ortflow.trainable_weights": ",".join(ortflow.trainable_initializers(onx)),
    })
    return ctx.metrics
