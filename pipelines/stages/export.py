"""Stage ``export``: log the deployable model with MLflow, register a version, promote it with an alias.

The logged model (:mod:`pipelines.tracking.deploy`) has two flavors over one file, ``deploy_model.onnx`` (raw
features in, predictions in the target's units or class labels out): an MLflow pyfunc
(:mod:`pipelines.tracking.serving_model`, logged as code: nothing pickled) and ``onnx``. The pyfunc takes the
feature columns by name, in any numeric dtype, and answers a missing or non-finite cell with an error naming its
column and row (HTTP 400 from ``mlflow models serve``); it returns ``prediction`` (regression) or the labels
(classification; ``params={"output": "probabilities"}`` adds one probability column per class). The input example
is five test rows; the requirements name the plain onnxruntime. Before logging, the graph is run on the whole
test split: non-finite predictions fail the run and nothing is registered. ``promotion.register`` says which
models become versions (by default only one that takes ``promotion.alias``, i.e. whose ``promotion.metric``
beats the current holder's); see :mod:`pipelines.tracking.promotion`.

The run also logs ``training_package/``: the trained weights as a training package (docs/TRAINING_OUTSIDE_PYTHON.md,
:func:`ortflow.export_training_package` of ``model_with_loss.onnx`` holding the trained weights, with the configured
optimizer, schedule and batch size), which a browser, Node or a device trains on the raw rows (the standardization
sits inside its graphs, which predict in the target's units: the manifest's ``preprocess``); ``python -m
pipelines.import_states`` brings the states trained there back as a new version.

    python -m pipelines.export source.run_id=<evaluate run> promotion.metric=test_r2
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pandas as pd

import ortflow

from .. import tracking as tr
from ..base.builders import trainer_arguments
from ..base.schema import RegisterPolicy
from ..data.datasets import Split
from ..tracking import promotion
from ..tracking.lineage import logged_model_name
from ..modeling.predictions import check_finite_predictions, onnx_predict
from ..execution.runner import StageContext, in_multirun


def model_config(split: Split) -> dict:
    """What :class:`pipelines.tracking.serving_model.DeployedOnnxModel` reads at load time (plain JSON values)."""
    config = {"features": [str(f) for f in split.feature_names], "task": split.task}
    if split.task == "classification":
        config["classes"] = split.classes.tolist()
    if split.is_table:  # the raw columns, by kind: the served model converts each cell as training did
        from ..data.tables import TEXT_MISSING

        config["columns"] = split.column_kinds()
        config["text_missing"] = TEXT_MISSING
    return config


def input_example(split: Split, rows: int = 5) -> pd.DataFrame:
    """Raw test rows as a float64 frame named by the features (a table's columns as a CSV has them: text, numbers
    with gaps, dates as ISO text): stored with the model, which MLflow runs on them when logging it."""
    if split.is_table:
        frame = split.X_test[:rows].copy()
        for name, kind in split.column_kinds().items():
            if kind == "date":
                frame[name] = frame[name].dt.strftime("%Y-%m-%d")
        return frame
    return pd.DataFrame(split.raw_rows(split.X_test[:rows]).astype(np.float64),
                        columns=[str(f) for f in split.feature_names])


#: the run artifact (a folder) holding the registered weights as a training package
PACKAGE_ARTIFACT = "training_package"
#: the trainer settings a package takes from the config (the rest of training happens where the package goes)
PACKAGE_SETTINGS = ("learning_rate", "batch_size", "weights_to_train", "device")


def package_trainer(ctx: StageContext) -> ortflow.OrtGradientOptimizer:
    """An unfitted full trainer of ``model_with_loss.onnx`` holding the trained weights (those of
    ``trained_model.onnx``), with the configured optimizer, schedule and batch size: what the package is made of."""
    loss_graph = ctx.bundle.load_onnx("model_with_loss", ctx.name)
    trained = ortflow.get_initializers(ctx.bundle.load_onnx("trained_model", ctx.name))
    start = ortflow.get_initializers(loss_graph)
    weights = {name: value for name, value in trained.items()
               if name in start and value.dtype == np.float32 and value.shape == start[name].shape}
    settings = {k: v for k, v in trainer_arguments(ctx.cfg).items() if k in PACKAGE_SETTINGS}
    return ortflow.OrtGradientOptimizer(ortflow.replace_initializers(loss_graph, weights), loss_output_name="loss",
                                        label_name="label", **settings)


def log_training_package(ctx: StageContext, split: Split, estimator, source: dict) -> str:
    """Write ``estimator``'s training package, the split's standardization inside its graphs (raw rows in,
    predictions in the target's units: the manifest's ``preprocess``), with ``source`` (where the weights come from)
    as its metadata, and log it as :data:`PACKAGE_ARTIFACT`; returns the artifact path."""
    metadata = {"task": split.task, "features": [str(f) for f in split.feature_names],
                "model": str(ctx.cfg.model.name), **source}
    names = [str(f) for f in split.feature_names] if not split.is_table else None
    folder = ortflow.export_training_package(estimator, ctx.work_dir / PACKAGE_ARTIFACT, overwrite=True,
                                             feature_names=names, metadata=metadata, **package_preprocess(split))
    logged = tr.log_folder(ctx.tracking, ctx.run_id, folder, PACKAGE_ARTIFACT)
    ctx.set_tags({"ortflow.training_package": logged})
    return logged


def package_preprocess(split: Split) -> dict:
    """:func:`ortflow.export_training_package`'s preprocessing arguments for ``split``: its standardization (the
    features', a regressor's target's), a table's column kinds (converted by the runtime: no graph does it)."""
    found = {}
    if len(split.x_mean):
        found["feature_scaling"] = (split.x_mean, split.x_scale)
    if split.task == "regression" and (split.y_mean != 0.0 or split.y_scale != 1.0):
        found["target_scaling"] = (split.y_mean, split.y_scale)
    if split.is_table:
        from ..data.tables import TEXT_MISSING

        found.update(columns=split.column_kinds(), text_missing=TEXT_MISSING)
    return found


def export(ctx: StageContext) -> dict:
    cfg = ctx.cfg
    split = Split.load(ctx.bundle.path("split", ctx.name))
    model = ctx.bundle.load_onnx("deploy_model", ctx.name)
    evaluation = ctx.bundle.read_json("evaluation", ctx.name)["metrics"]
    try:
        log_training_package(ctx, split, package_trainer(ctx), {"run_id": ctx.run_id})
    except ortflow.OrtflowError as exc:  # a graph ortflow's own step cannot train: registered all the same
        ctx.set_tags({"ortflow.training_package": f"not written: {type(exc).__name__}: {str(exc)[:1000]}"})
    return register_model(ctx, split, model, evaluation, str(cfg.mlflow.registered_model_name))


def register_model(ctx: StageContext, split: Split, model: onnx.ModelProto, evaluation: dict, name: str) -> dict:
    """Log ``model`` (the deploy graph) with the test metrics ``evaluation``, register it as a version of ``name``
    as ``promotion`` says and pass it through the gate; the run's metrics (``registered_version``...)."""
    cfg = ctx.cfg
    ctx.log_metrics(evaluation)  # the version's run carries the metrics the next promotion compares with

    metric = cfg.promotion.metric or promotion.default_metric(ctx.task)
    if metric not in evaluation:
        raise KeyError(f"promotion.metric={metric!r} is not among the evaluation metrics {sorted(evaluation)}")
    direction = str(cfg.promotion.direction) if cfg.promotion.direction else promotion.default_direction(metric)
    value = evaluation[metric]

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    # the graph about to be registered, run on the whole test split: a NaN model never reaches the registry
    check_finite_predictions(onnx_predict(session, split.raw_X(split.X_test), split.task), split)
    graph_path = ctx.work_dir / "deploy_model.onnx"  # the graph checked above, self-contained
    onnx.save(model, graph_path)
    from ..tracking import deploy  # imports the model's code (serving_model), which only export needs

    info = deploy.log_deploy_model(ctx.tracking, logged_model_name(cfg), graph_path, model_config(split),
                                   input_example(split))
    ctx.set_tags({"ortflow.model_uri": info.model_uri, "ortflow.promotion.metric": metric})

    candidate = promotion.Candidate(
        name, info.model_uri, ctx.run_id, metric, direction, value,
        str(cfg.promotion.alias), split.fingerprint(), bool(cfg.promotion.require_same_data),
        bool(cfg.promotion.enabled), str(cfg.promotion.get("register") or RegisterPolicy.if_promoted),
        float(cfg.promotion.min_relative_improvement), float(cfg.promotion.min_absolute_improvement))
    ctx.set_tags({promotion.FINGERPRINT_TAG: candidate.fingerprint, **candidate.tags()})
    if in_multirun():  # a sweep registers only its best trial, by the optimized metric, once every trial ended
        ctx.set_tags({"ortflow.registered": "deferred: the sweep registers its best trial"})
        return ctx.metrics
    version, decision = promotion.register(ctx.tracking, candidate)
    if decision is not None:
        ctx.metrics.update(promoted=float(decision.promoted), promotion_decision=decision.decision,
                           promotion_reason=decision.reason)
    if version is None:
        reason = decision.reason if decision is not None else f"promotion.register={candidate.policy}"
        ctx.metrics["not_registered"] = f"{reason}; the logged model: {info.model_uri}"
        return ctx.metrics
    ctx.metrics["registered_model"] = candidate.name
    ctx.metrics["registered_version"] = version
    return ctx.metrics
