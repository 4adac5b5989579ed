"""Stage ``export``: log the deployable model with MLflow, register a version, promote it with an alias.

The logged model is an MLflow pyfunc model (:mod:`pipelines.tracking.serving_model`, logged as code: nothing pickled)
that runs ``deploy_model.onnx`` (raw features in, predictions in the target's units or class labels out) with
onnxruntime. Its signature is column-based, with the data's feature names as float64 columns, so
``mlflow.pyfunc.load_model(...).predict(frame)`` and ``mlflow models serve`` match columns by name and cast
numbers; outputs are ``prediction`` (regression), or ``label`` and ``probabilities`` (classification). The input
example is five test rows; the pip requirements name the onnxruntime *training* package (MLflow's default for
ONNX names plain ``onnxruntime``, which must never be installed beside it). Before logging, the graph is run on
the whole test split: non-finite predictions fail the run and nothing is registered. The version takes
``promotion.alias`` only when its ``promotion.metric`` beats the current holder's; see
:mod:`pipelines.tracking.promotion`.

    python -m pipelines.export source.run_id=<evaluate run> promotion.metric=test_r2
"""

from __future__ import annotations

import importlib.metadata
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pandas as pd

from .. import tracking as tr
from ..data.datasets import Split
from ..tracking import promotion
from ..tracking.lineage import logged_model_name
from ..modeling.predictions import check_finite_predictions, onnx_predict
from ..execution.runner import StageContext, in_multirun


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
    requirements += [f"onnx=={onnx.__version__}", f"numpy>={np.__version__.split('.')[0]}",
                     f"pandas>={pd.__version__.split('.')[0]}"]
    return requirements


def model_config(split: Split) -> dict:
    """What :class:`pipelines.tracking.serving_model.DeployedOnnxModel` reads at load time (plain JSON values)."""
    config = {"features": [str(f) for f in split.feature_names], "task": split.task}
    if split.task == "classification":
        config["classes"] = split.classes.tolist()
    return config


def input_example(split: Split, rows: int = 5) -> pd.DataFrame:
    """Raw test rows as a float64 frame named by the features: what the signature is inferred from."""
    return pd.DataFrame(split.raw_X(split.X_test[:rows]).astype(np.float64),
                        columns=[str(f) for f in split.feature_names])


def log_deploy_model(ctx: StageContext, split: Split, graph_path: Path):
    """Log the pyfunc model around the deploy graph; MLflow infers the signature by running it on the example
    (column-based inputs from the named float64 frame; outputs from the model's answer), so the example
    round-trips before anything is registered."""
    from ..tracking import serving_model

    with warnings.catch_warnings():  # the signature is given by the example (see serving_model.predict)
        warnings.filterwarnings("ignore", message=".*Add type hints to the `predict` method")
        return tr.log_code_model(
            ctx.tracking, logged_model_name(ctx.cfg), Path(serving_model.__file__),
            artifacts={serving_model.GRAPH: str(graph_path)}, model_config=model_config(split),
            input_example=input_example(split), pip_requirements=pip_requirements(),
        )


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
    graph_path = ctx.work_dir / "deploy_model.onnx"  # the graph checked above, self-contained
    onnx.save(model, graph_path)
    info = log_deploy_model(ctx, split, graph_path)
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
