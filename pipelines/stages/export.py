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
from ..runner import StageContext
from ..tracking import is_finite


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

    example = split.raw_X(split.X_test[:5])
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = dict(zip([o.name for o in session.get_outputs()],
                       session.run(None, {session.get_inputs()[0].name: example})))
    signature = infer_signature(example, outputs)
    info = ctx.tracking.call(
        mlflow.onnx.log_model, model, name="model", signature=signature, input_example=example,
        pip_requirements=pip_requirements(), onnx_execution_providers=["CPUExecutionProvider"],
    )
    ctx.set_tags({"ortflow.model_uri": info.model_uri, "ortflow.promotion.metric": metric})

    name = str(cfg.mlflow.registered_model_name)
    if not is_finite(value):
        decision = promotion.promote(ctx.tracking, name, None, ctx.run_id, value, metric, direction,
                                     str(cfg.promotion.alias))
        ctx.set_tags({"ortflow.registered": "false (non-finite metric)"})
        ctx.log_metrics({"promoted": 0.0})
        print(f"ortflow: not registered: {decision.reason}")
        return ctx.metrics
    fingerprint = split.fingerprint()
    ctx.set_tags({promotion.FINGERPRINT_TAG: fingerprint})
    version = ctx.tracking.call(mlflow.register_model, info.model_uri, name,
                                tags={"ortflow.run_id": ctx.run_id, f"ortflow.metric.{metric}": str(value),
                                      promotion.FINGERPRINT_TAG: fingerprint})
    ctx.set_tags({"ortflow.registered_model": name, "ortflow.registered_version": str(version.version)})
    if cfg.promotion.enabled:
        decision = promotion.promote(ctx.tracking, name, str(version.version), ctx.run_id, value, metric, direction,
                                     str(cfg.promotion.alias), fingerprint=fingerprint,
                                     require_same_data=bool(cfg.promotion.require_same_data))
        ctx.log_metrics({"promoted": float(decision.promoted)})
        ctx.metrics["promotion_decision"] = decision.decision
        ctx.metrics["promotion_reason"] = decision.reason
    ctx.metrics["registered_model"] = name
    ctx.metrics["registered_version"] = str(version.version)
    return ctx.metrics
