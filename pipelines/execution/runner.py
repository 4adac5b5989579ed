"""Running one stage inside an MLflow run, alone or as a step of the chain.

A stage is a function ``fn(ctx: StageContext) -> dict`` of summary metrics. :func:`execute_stage` wraps it: the
run (created under a parent, or the one ``mlflow run`` passed), the resolved config as params and YAML, the
stage's wall time, the data it read as dataset inputs (:mod:`pipelines.tracking.lineage`), the manifest of outputs; and
FAILED with the reason as a tag when it raises.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from .. import tracking as tr
from .bundle import Bundle
from ..base.checks import validate
from ..base.resolvers import register_configs
from ..base.schema import task_of
from ..base.handoff import JOB_RUN_FILE, SWEEP_RUN_ENV, SWEEP_RUN_FILE
from ..data.datasets import Split
from ..tracking.lineage import STAGE_INPUTS, log_split_inputs


@dataclass
class StageContext:
    name: str
    cfg: DictConfig
    tracking: tr.Tracking
    run_id: str
    work_dir: Path
    bundle: Bundle
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def task(self) -> str:
        return task_of(self.cfg)

    def log_file(self, path: str | Path, artifact_path: str | None = None, entry: str | None = None) -> str:
        """Log ``path`` as an artifact; with ``entry``, later stages find it in the bundle under that name."""
        logged = tr.log_artifact(self.tracking, self.run_id, path, artifact_path)
        if entry:
            self.bundle.add(entry, path, self.run_id, logged)
        return logged

    def log_metrics(self, metrics: dict[str, Any], step: int = 0) -> None:
        tr.log_metrics(self.tracking, self.run_id, metrics, step)
        self.metrics.update({k: v for k, v in metrics.items() if v is not None})

    def set_tags(self, tags: dict[str, Any]) -> None:
        tr.set_tags(self.tracking, self.run_id, tags)

    def log_params(self, params: dict[str, Any]) -> None:
        for key, value in params.items():
            tr.log_param(self.tracking, self.run_id, key, value)


StageFn = Callable[[StageContext], dict]


def execute_stage(name: str, fn: StageFn, cfg: DictConfig, tracking: tr.Tracking, bundle: Bundle, work_dir: Path,
                  parent_run_id: str | None = None, run_id: str | None = None,
                  on_start: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``fn`` in its own MLflow run; returns the metrics it logged plus ``time_<name>_seconds``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    tags = {"ortflow.stage": name, "ortflow.task": task_of(cfg), "ortflow.trainer": str(cfg.trainer.name),
            **dict(cfg.mlflow.tags)}
    with tr.stage_run(tracking, name, parent_run_id=parent_run_id, run_id=run_id, tags=tags,
                      system_metrics=bool(cfg.mlflow.system_metrics),
                      system_metrics_interval=float(cfg.mlflow.get("system_metrics_interval") or 0) or None) as rid:
        if on_start is not None:
            on_start(rid)
        ctx = StageContext(name, cfg, tracking, rid, work_dir, bundle)
        tr.log_config(tracking, rid, cfg, work_dir / "config")
        begin = time.perf_counter()
        fn(ctx)
        ctx.log_metrics({f"time_{name}_seconds": time.perf_counter() - begin})
        if name in STAGE_INPUTS and "split" in bundle:  # the data the stage read, as MLflow dataset inputs
            log_split_inputs(tracking, rid, Split.load(bundle.path("split", name)), cfg.data, name)
        tr.log_artifact(tracking, rid, bundle.write(work_dir))
    return {**ctx.metrics, "run_id": rid}


def prepare(cfg: DictConfig) -> tr.Tracking:
    """Checks shared by every entry point, then the tracking connection."""
    register_configs()
    validate(cfg)
    return tr.setup(cfg)


def job_dir() -> Path:
    """Hydra's output folder for this job (``outputs/...`` or ``multirun/.../<n>``), or a new temporary one."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(tempfile.mkdtemp(prefix="ortflow-"))


def work_dir_for(name: str) -> Path:
    return job_dir() / name


def sweep_parent_run_id() -> str | None:
    """The sweep's parent run when this process runs a job of a Hydra multirun (see
    pipelines.orchestration.sweep_callback)."""
    from hydra.core.hydra_config import HydraConfig

    if not in_multirun():
        return None
    path = Path(HydraConfig.get().sweep.dir) / SWEEP_RUN_FILE
    if path.exists():
        return path.read_text().strip() or None
    return os.environ.get(SWEEP_RUN_ENV) or None


def in_multirun() -> bool:
    """True in a job of a Hydra ``-m`` sweep."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def trial_run_name() -> str | None:
    """In a sweep, the job's overrides (``trainer.learning_rate=0.01 model.hidden_layer_sizes=[16]``): what tells
    its run from the other trials'."""
    if not in_multirun():
        return None
    from hydra.core.hydra_config import HydraConfig

    return " ".join(HydraConfig.get().overrides.task)[:250] or None


def remember_job_run(run_id: str) -> None:
    """Leave the job's run id in its output folder, so the sweep callback can tell jobs that made no run."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        folder = Path(HydraConfig.get().runtime.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / JOB_RUN_FILE).write_text(run_id)


def objective(cfg: DictConfig, metrics: dict[str, Any]) -> float | None:
    """The value returned to Hydra (and Optuna): ``metrics[cfg.optimized_metric]``."""
    value = metrics.get(str(cfg.optimized_metric))
    return float(value) if tr.is_finite(value) else (math.nan if value is not None else None)


#: what makes a source run's outputs another problem's: a stage alone must be composed with the same
SOURCE_IDENTITY = ("data.name", "data.path", "data.target", "data.task", "model.name")


def check_source_problem(tracking: tr.Tracking, cfg: DictConfig) -> None:
    """A stage run alone from ``source.run_id`` whose config names another data set or model than that run's is
    refused, naming each difference: it would train the source's data and model while logging its own config's
    names and datasets (seen: ``data.name=regression``, ``model.name=linear`` on a run of another table)."""
    from ..base.schema import ConfigError

    if not cfg.source.run_id:
        return
    try:
        params = tr.run_params(tracking, str(cfg.source.run_id))
    except Exception:  # noqa: BLE001 - Bundle.from_source names a missing run
        return
    differ = tr.param_differences(params, cfg, SOURCE_IDENTITY)
    if differ:
        raise ConfigError(f"source.run_id={cfg.source.run_id} ran another problem: {'; '.join(differ)}; compose "
                          "this stage with the source run's config groups (its overrides are its ortflow.overrides "
                          "tag and its params)")


def run_standalone(name: str, fn: StageFn, cfg: DictConfig) -> float | None:
    """Entry point of ``python -m pipelines.<stage>``: one run, inputs from ``source.run_id``/``source.path``."""
    tracking = prepare(cfg)
    check_source_problem(tracking, cfg)
    bundle = Bundle.from_source(cfg.source)
    env_run = os.environ.get("MLFLOW_RUN_ID") or None
    parent = None if env_run else sweep_parent_run_id()
    metrics = execute_stage(name, fn, cfg, tracking, bundle, work_dir_for(name), parent_run_id=parent,
                            run_id=env_run, on_start=remember_job_run)
    print(f"ortflow: stage {name!r} finished: run {metrics['run_id']} "
          f"(experiment {tracking.experiment_name!r}, store {tracking.uri})")
    print(f"  continue from it: source.run_id={metrics['run_id']}")
    print(f"  look at it: {tracking.ui_hint(metrics['run_id'])}")
    return objective(cfg, metrics)


__all__ = ["StageContext", "execute_stage", "run_standalone", "prepare", "objective"]
