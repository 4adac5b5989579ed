"""Stage ``export``: log the deployable ONNX model with MLflow, register a version, promote it with an alias.

The logged model is ``deploy_model.onnx`` (raw features in, predictions in the target's units out) with a
signature, an input example and pip requirements naming the onnxruntime *training* package (MLflow's default
names plain ``onnxruntime``, which must never be installed beside it). The version takes ``promotion.alias``
only when its ``promotion.metric`` beats the current holder's; see :mod:`pipelines.promotion`.

    python -m pipelines.export source.run_id=<evaluate run> promotion.metric=test_r2
"""

from __future__ import annotations

import importlib.metadata

import mlflow
import numpy as np
import onnx
import onnxruntime
from mlflow.models import infer_signature

from .. import promotion
from ..data import Split
from ..runner import StageContext, in_multirun
from .evaluate import check_finite_predictions, onnx_predict


def pip_requirements() -> list[str]:
    """The runtime the model needs: the installed onnxruntime build (training or plain, never both)."""
    requirements = []
    for package in ("onnxruntime-training-cpu", "onnxruntime-training", "onnxruntime", "onnxruntime-gpu"):
        try:
            requirements.append(f"{package}=={importlib.metadata.version(package)}")
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    else:  # pragma: no cover - an onnxruntime installed without package metadata
        requirements.append("onnxruntime-training-cpu==1.19.2")
    requirements += [f"onnx=={onnx.__version__}", f"numpy>={np.__version__.split('.')[0]}"]
    return requirements


def export(ctx: StageContext) -> dict:
    cfg = ctx.cfg
    split = Split.load(ctx.bundle.path("split", ctx.name))
    model = ctx.bundle.load_onnx("deploy_model", ctx.name)
    evaluation = ctx.bundle.read_json("evaluation", ctx.name)["metrics"]
    ctx.log_metrics(evaluation)  # the version's run carries the metrics the next promotion compares with

    metric = cfg.promotion.metric or promotion.default_metric(ctx.task)
    if metric not in evaluation:
        raise KeyError(f"promotion.metric={metric!r} is not among the evaluation metrics {sorted(evaluation)}")
    direction = str(cfg.promotion.direction) if cfg.promotion.direction else promotion.default_direction(metric)
    value = evaluation[metric]

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    # the graph about to be registered, run on the whole test split: a NaN model never reaches the registry
    check_finite_predictions(onnx_predict(session, split.raw_X(split.X_test), split.task), split)
    example = split.raw_X(split.X_test[:5])
    outputs = dict(zip([o.name for o in session.get_outputs()],
                       session.run(None, {session.get_inputs()[0].name: example})))
    signature = infer_signature(example, outputs)
    info = ctx.tracking.call(
        mlflow.onnx.log_model, model, name="model", signature=signature, input_example=example,
        pip_requirements=pip_requirements(), onnx_execution_providers=["CPUExecutionProvider"],
    )
    ctx.set_tags({"ortflow.model_uri": info.model_uri, "ortflow.promotion.metric": metric})

    candidate = promotion.Candidate(
        str(cfg.mlflow.registered_model_name), info.model_uri, ctx.run_id, metric, direction, value,
        str(cfg.promotion.alias), split.fingerprint(), bool(cfg.promotion.require_same_data),
        bool(cfg.promotion.enabled))
    ctx.set_tags({promotion.FINGERPRINT_TAG: candidate.fingerprint, **candidate.tags()})
    if in_multirun():  # a sweep registers only its best trial, by the optimized metric, once every trial ended
        ctx.set_tags({"ortflow.registered": "deferred: the sweep registers its best trial"})
        return ctx.metrics
    version, decision = promotion.register(ctx.tracking, candidate)
    if decision is not None:
        ctx.metrics.update(promoted=float(decision.promoted), promotion_decision=decision.decision,
                           promotion_reason=decision.reason)
    if version is None:
        print(f"ortflow: not registered: {decision.reason}")
        return ctx.metrics
    ctx.metrics["registered_model"] = candidate.name
    ctx.metrics["registered_version"] = version
    return ctx.metrics
