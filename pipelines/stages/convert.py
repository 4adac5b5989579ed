"""Stage ``convert``: load the data, split it (seeded), fit the scikit-learn model, convert it with ortflow.

Two scikit-learn fits of the configured model: the *start* (``model.start_max_iter`` iterations, under-trained on
purpose: the weights ONNX training begins from) and the *reference* (the same estimator with its own solver and
its class's default iterations, fitted to convergence: what training is compared with). Logged: the params
``start.max_iter``/``start.n_iter`` and ``sklearn_reference.max_iter``/``n_iter``/``converged``/``solver``, the
metrics ``time_start_fit_seconds`` and ``time_sklearn_fit_seconds`` (the reference's).

Outputs: ``split.npz`` (standardized train/validation/test arrays and the statistics), ``sklearn_reference.npz``
(the test predictions of the reference, ``test_predictions``, and of the start, ``start_test_predictions``: what
``evaluate`` compares with; data, never a pickle) and ``model.onnx`` (the start as the graph training begins from).

``data=parquet`` (:mod:`pipelines.data.streams`): both fits and the standardization use the first
``data.sample_rows`` rows of the training part; ``split.npz`` holds each part's sample and the split's description,
and ``sklearn_reference.npz`` the baselines' test metrics (``test_metrics``, JSON), the test part streamed once
through both models. The table's files, digest, schema and rows are tagged ``ortflow.data.*`` and logged as
``data/table.json``.

``model=onnx`` fits nothing: the graph of ``model.path`` is loaded, checked against the data and ortflow's gradient
rules, and given the outputs the later stages read (:mod:`pipelines.modeling.onnx_graph`); there is no
``sklearn_reference.npz`` (``evaluate`` tags the baselines as not applicable).

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
from ..modeling.estimators import (build_estimator, build_preprocessing, fit_estimator, fit_summary,
                                   reference_estimator, sklearn_predict)
from ..execution.runner import StageContext


def fitted_estimator(cfg: DictConfig, split: Split, max_iter: int | None = None):
    """The start: the configured scikit-learn model fitted on the training rows for ``model.start_max_iter``
    iterations (``max_iter`` caps them further); on a table's raw columns, a Pipeline of the preprocessing
    (``preprocess``) and the model."""
    estimator = build_estimator(cfg.model, int(cfg.seed))
    if max_iter is not None and "max_iter" in estimator.get_params():
        estimator.set_params(max_iter=max_iter)
    if split.is_table:
        from sklearn.pipeline import make_pipeline

        treatments = {str(k): str(v) for k, v in (cfg.preprocess.get("columns") or {}).items()}
        check_no_empty_column(split, treatments)
        estimator = make_pipeline(build_preprocessing(split.column_kinds(), treatments), estimator)
    return fit_estimator(estimator, split.X_train, split.y_train, str(cfg.data.task))


def check_no_empty_column(split: Split, treatments: dict[str, str]) -> None:
    """A DataError naming the table's columns whose training rows are all missing (kept by the config): nothing
    can be learnt from them, and the imputer drops them, so the graph would not convert (seen as a ``to_onnx``
    traceback)."""
    import pandas as pd

    from ..base.errors import DataError

    empty = [str(c) for c in split.X_train.columns if treatments.get(str(c)) != "drop"
             and bool(pd.isna(split.X_train[c]).all())]
    if empty:
        raise DataError(f"the columns {empty} have no value in the training rows: drop them with "
                        + " ".join(f"+preprocess.columns.{c}=drop" for c in empty))


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
    if split.streamed:  # the files, their digest, schema and rows, from their metadata (pipelines.tracking.lineage)
        from ..tracking.lineage import stream_lineage

        ctx.set_tags(stream_lineage(split, ctx.work_dir / "table.json"))
        ctx.log_file(ctx.work_dir / "table.json", "data")
    if cfg.mlflow.log_split:
        ctx.log_file(split.save(ctx.work_dir / "split.npz"), "data", entry="split")
    else:  # later stages in this process still find it; a stage run alone needs source.path
        ctx.bundle.add("split", split.save(ctx.work_dir / "split.npz"))

    if str(cfg.model.name) == "onnx":
        return _own_graph(ctx, split)
    begin = time.perf_counter()
    estimator = fitted_estimator(cfg, split)
    ctx.log_metrics({"time_start_fit_seconds": time.perf_counter() - begin})
    begin = time.perf_counter()
    if fit_summary(estimator)["solver"] == "exact":  # least squares, Ridge: the start is the reference
        reference = estimator
    else:
        reference = fit_estimator(reference_estimator(estimator), split.X_train, split.y_train, ctx.task,
                                  quiet=False)
    ctx.log_metrics({"time_sklearn_fit_seconds": time.perf_counter() - begin})
    start_fit, reference_fit = fit_summary(estimator), fit_summary(reference)
    ctx.log_params({**{f"start.{k}": v for k, v in start_fit.items() if k in ("max_iter", "n_iter")},
                    **{f"sklearn_reference.{k}": v for k, v in reference_fit.items()}})
    ctx.set_tags({"ortflow.sklearn_reference": f"{type(reference).__name__}: " + (
        "exact solution, the start itself" if reference is estimator else
        f"solver {reference_fit['solver'] or 'default'}, {reference_fit['n_iter']} of max_iter="
        f"{reference_fit['max_iter']} iterations ({'converged' if reference_fit['converged'] else 'NOT converged'})")})

    def test_predictions(model, X_test=split.X_test) -> np.ndarray:
        predicted = sklearn_predict(model, X_test, ctx.task)
        return (split.raw_y(predicted) if ctx.task == "regression" else predicted).astype(np.float64)

    if split.streamed:  # the test part streamed once through both: their metrics, not every prediction
        from ..modeling.streamed import streamed_test

        def predictor(model):
            def predict(X: np.ndarray) -> np.ndarray:  # a table's columns as they are, else standardized
                return test_predictions(model, X if split.is_table else
                                        ((X - split.x_mean) / split.x_scale).astype(np.float32))
            return predict

        scored = streamed_test(split, {"sklearn": predictor(reference), "start": predictor(estimator)})
        np.savez(ctx.work_dir / "sklearn_reference.npz", test_metrics=np.array(json.dumps(scored.metrics)),
                 split_fingerprint=np.array(split.fingerprint()))
    else:
        np.savez(ctx.work_dir / "sklearn_reference.npz", test_predictions=test_predictions(reference),
                 start_test_predictions=test_predictions(estimator), split_fingerprint=np.array(split.fingerprint()))
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


def own_graph(cfg: DictConfig, split: Split) -> onnx.ModelProto:
    """``model=onnx``: the graph of ``model.path``, checked against the split (a :class:`ConfigError` listing every
    problem) and given the outputs the stages read."""
    from ..modeling.onnx_graph import check_graph, pipeline_graph

    graph = check_graph(cfg, split.X_train, len(split.classes))
    return pipeline_graph(graph, split.task, split.classes, cfg.model.get("output"))


def _own_graph(ctx: StageContext, split: Split) -> dict:
    begin = time.perf_counter()
    onx = own_graph(ctx.cfg, split)
    onnx.save(onx, ctx.work_dir / "model.onnx")
    ctx.log_metrics({"time_load_graph_seconds": time.perf_counter() - begin})
    ctx.log_file(ctx.work_dir / "model.onnx", "graphs", entry="model")
    ctx.set_tags({
        "ortflow.sklearn_model": "none (model=onnx)",
        "ortflow.sklearn_reference": f"not applicable: model=onnx trains the graph {ctx.cfg.model.path}",
        "ortflow.onnx_outputs": ",".join(o.name for o in onx.graph.output),
        "ortflow.trainable_weights": ",".join(ortflow.trainable_initializers(onx)),
    })
    return ctx.metrics
