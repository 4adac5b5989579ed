"""The chain: convert -> add_loss -> train -> evaluate -> export in one parent MLflow run, a nested run per stage.

Started by ``python -m pipelines.main`` (see pipelines/main.py). Under ``mlflow run`` (MLFLOW_RUN_ID set) the chain
logs into that run as the parent; in a ``-m`` sweep each job's parent run nests under the sweep's run (see
pipelines.orchestration.sweep_callback).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from .. import tracking as tr
from ..execution.bundle import Bundle
from ..base.stages import stage_function
from ..base.metric_names import PREFIXES
from ..base.schema import task_of
from .precheck import check_training_settings
from ..execution.runner import (
    execute_stage,
    in_multirun,
    job_dir,
    objective,
    prepare,
    remember_job_run,
    sweep_parent_run_id,
    trial_run_name,
)



@dataclass
class ChainResult:
    run_id: str
    stage_run_ids: dict[str, str]
    metrics: dict[str, Any]
    tracking: tr.Tracking
    value: float | None = None


def run_chain(cfg: DictConfig, work_dir: Path | None = None) -> ChainResult:
    """Run ``cfg.stages`` in order; each stage's outputs feed the next through the bundle."""
    tracking = prepare(cfg)
    check_training_settings(cfg)
    if "train" in [str(s) for s in cfg.stages]:  # a checkpoint of another optimizer or model: before any stage
        from ..tracking.checkpoints import check_resumable

        check_resumable(tracking, cfg)
    bundle = Bundle.from_source(cfg.source)
    env_run = os.environ.get("MLFLOW_RUN_ID") or None
    sweep_parent = None if env_run else sweep_parent_run_id()
    base = Path(work_dir) if work_dir else job_dir()
    stages = [str(s) for s in cfg.stages]
    name = cfg.mlflow.run_name or trial_run_name() or f"{cfg.data.name}-{cfg.model.name}-{cfg.trainer.name}"
    tags = {"ortflow.pipeline": "main", "ortflow.stages": ",".join(stages), "ortflow.task": task_of(cfg),
            "ortflow.trainer": str(cfg.trainer.name), **dict(cfg.mlflow.tags)}
    stage_runs: dict[str, str] = {}
    metrics: dict[str, Any] = {}
    with tr.parent_run(tracking, name, run_id=env_run, parent_run_id=sweep_parent, tags=tags) as parent_id:
        remember_job_run(parent_id)
        tr.log_config(tracking, parent_id, cfg, base / "config")
        for stage in stages:
            result = execute_stage(stage, stage_function(stage), cfg, tracking, bundle, base / stage,
                                   parent_run_id=parent_id)
            stage_runs[stage] = result.pop("run_id")
            metrics.update(result)
            tr.set_tags(tracking, parent_id, {f"ortflow.run.{stage}": stage_runs[stage]})
        tr.log_metrics(tracking, parent_id, metrics)
        tr.log_artifact(tracking, parent_id, bundle.write(base))
        value = objective(cfg, metrics)
        if value is not None:
            tr.log_metrics(tracking, parent_id, {"objective": value})
    return ChainResult(parent_id, stage_runs, metrics, tracking, value)


def report(result: ChainResult, cfg: DictConfig) -> str:
    """The lines printed at the end of a chain."""
    m = result.metrics
    lines = [
        f"ortflow pipeline finished: run {result.run_id}",
        f"  experiment: {result.tracking.experiment_name!r} (id {result.tracking.experiment_id}), "
        f"store {result.tracking.uri}",
        "  stage runs: " + ", ".join(f"{k}={v}" for k, v in result.stage_run_ids.items()),
    ]
    shown = {k: v for k, v in sorted(m.items()) if (k.startswith(PREFIXES) and "_class_" not in k)
             or k in ("train_loss", "validation_loss")}  # per-class metrics: in the evaluate run
    if shown:
        lines.append("  metrics: " + ", ".join(f"{k}={v:.5g}" for k, v in shown.items() if isinstance(v, float)))
    if "registered_version" in m:
        lines.append(f"  model: models:/{m['registered_model']}/{m['registered_version']}"
                     + (f" ({m['promotion_decision']} @{cfg.promotion.alias}: {m['promotion_reason']})"
                        if "promotion_decision" in m else ""))
    elif "not_registered" in m:
        lines.append(f"  model: not registered: {m['not_registered']}")
    lines.append(f"  {cfg.optimized_metric} = {result.value}")
    if not in_multirun():  # a sweep prints the UI line once, with its parent run (sweep_callback)
        lines.append(f"  MLflow UI: {result.tracking.ui_hint(result.run_id)}")
    return "\n".join(lines)
