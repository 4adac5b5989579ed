"""Hydra callback grouping the jobs of a ``-m`` sweep under one MLflow parent run.

``on_multirun_start`` runs once in the launching process, before any job: it creates the tracking store (so
parallel jobs never race to create the sqlite schema), the experiment and the sweep's parent run, whose id it
leaves in ``<sweep dir>/.mlflow_sweep_run_id`` (and the environment) for the jobs to nest under. ``on_job_end``
gives a job that failed before making a run a FAILED run with the reason, so no job goes unrecorded.
``on_multirun_end`` counts the jobs' runs, records the best trial by the optimized metric, registers its model
once (the trials themselves register nothing) and ends the sweep run. Workers sharing one Optuna study
(``hydra.sweeper.storage``) share one sweep run: the first creates it, the last to finish closes it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

#: file in the sweep directory holding the sweep run's id; environment variable with the same id
SWEEP_RUN_FILE = ".mlflow_sweep_run_id"
SWEEP_RUN_ENV = "ORTFLOW_SWEEP_RUN_ID"
#: file in a job's output directory holding the id of the run the job created
JOB_RUN_FILE = ".mlflow_run_id"


class MlflowSweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        from . import tracking as tr
        from .lineage import source_tags

        tracking = tr.setup(config)
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        tags = {"ortflow.sweep": "true", "ortflow.sweep_dir": str(sweep_dir.resolve()),
                "ortflow.sweeper": str(config.hydra.sweeper.get("_target_", "")),
                "ortflow.launcher": str(config.hydra.launcher.get("_target_", "")),
                "ortflow.overrides": " ".join(config.hydra.overrides.task)[:4900] or "(none)",
                "ortflow.optimized_metric": str(config.optimized_metric)}
        outer = os.environ.get("MLFLOW_RUN_ID")
        if outer:  # mlflow run ... -m: the sweep nests under mlflow run's run
            tags[MLFLOW_PARENT_RUN_ID] = outer
        name = f"sweep-{config.hydra.job.name}-{sweep_dir.name}"

        def create() -> str:
            return tracking.client.create_run(tracking.experiment_id, run_name=name,
                                              tags={**source_tags(), **tags}).info.run_id

        self.study = _shared_study(config)
        if self.study is None:
            self.run_id = create()
        else:  # workers of one study: the first creates the sweep run, the others nest their trials under it
            from . import study as st

            storage = str(config.hydra.sweeper.storage)
            tags["ortflow.study"] = f"{config.hydra.sweeper.study_name}"
            name = f"sweep-{config.hydra.sweeper.study_name}"
            self.run_id = st.once(self.study, storage, "ortflow.mlflow_sweep_run_id", create)
        (sweep_dir / SWEEP_RUN_FILE).write_text(self.run_id)
        os.environ[SWEEP_RUN_ENV] = self.run_id
        # a job started by MLFLOW_RUN_ID would log into that one run: the jobs nest under the sweep run instead
        self._outer = os.environ.pop("MLFLOW_RUN_ID", None)
        print(f"ortflow: sweep parent run {self.run_id} ({tracking.ui_hint(self.run_id)})")

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        from hydra.types import RunMode

        if job_return.status != JobStatus.FAILED or config.hydra.mode != RunMode.MULTIRUN:
            return
        error = job_return._return_value
        with contextlib.suppress(Exception):  # best effort: the job already failed
            record_failed_job(config, config.hydra, error if isinstance(error, BaseException) else None)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from . import tracking as tr

        run_id = getattr(self, "run_id", None)
        if run_id is None:
            return
        if getattr(self, "_outer", None):
            os.environ["MLFLOW_RUN_ID"] = self._outer
        if self.study is not None:
            from . import study as st

            if not st.claim_close(self.study, str(config.hydra.sweeper.storage),
                                  int(config.hydra.sweeper.n_trials)):
                print(f"ortflow: trials of study {self.study.study_name!r} are still running or were closed by "
                      f"another worker: the last worker to finish closes sweep run {run_id}")
                return
        tracking = tr.setup(config)
        close_sweep(tracking, config, run_id, self.study)


def _shared_study(config: DictConfig) -> Any:
    """The Optuna study that several workers share (``hydra.sweeper.storage`` set), else None."""
    storage = config.hydra.sweeper.get("storage")
    if not storage:
        return None
    from . import study as st

    return st.open_study(str(storage), str(config.hydra.sweeper.study_name),
                         str(config.hydra.sweeper.get("direction", "minimize")))


def sweep_direction(config: DictConfig) -> str:
    """The sweeper's direction, else the one the optimized metric's name implies (``*_loss`` is minimized)."""
    from .promotion import default_direction

    direction = config.hydra.sweeper.get("direction")
    return str(direction) if direction else default_direction(str(config.optimized_metric))


def close_sweep(tracking: Any, config: DictConfig, run_id: str, study: Any = None) -> None:
    """End the sweep run: job counts, the search space, the best trial by ``objective`` (the optimized, validation
    metric) with its parameters and test metrics (reported, never used to choose), the optimization results;
    then the best trial's model is registered, once, through the promotion gate."""
    from mlflow.entities import Param

    from . import promotion
    from . import tracking as tr

    client = tracking.client
    children = client.search_runs([tracking.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run_id}'",
                                  max_results=10000)
    finished = [r for r in children if r.info.status == "FINISHED"]
    summary: dict[str, Any] = {"jobs": len(children), "jobs_finished": len(finished),
                               "jobs_failed": sum(r.info.status == "FAILED" for r in children)}
    sweep_dir = Path(str(config.hydra.sweep.dir))
    if study is not None:  # the whole study, not only this worker's view
        import yaml

        from . import study as st

        (sweep_dir / "optimization_results.yaml").write_text(yaml.safe_dump(st.results(study), sort_keys=False))
    for name in ("search_space.yaml", "optimization_results.yaml"):
        if (sweep_dir / name).exists():
            tr.log_artifact(tracking, run_id, sweep_dir / name, "sweep")
    from .study import SearchSpaceError, parse_space

    try:
        dimensions, _ = parse_space(config.hydra.sweeper.get("params"), list(config.hydra.overrides.task))
    except SearchSpaceError:  # e.g. a glob() sweep of the basic sweeper: no distribution to describe
        dimensions = []
    tags = {"ortflow.search_space": "; ".join(f"{d.key}: {d.distribution}" for d in dimensions)[:4900] or "(none)"}
    direction = sweep_direction(config)
    scored = [r for r in finished if tr.is_finite(r.data.metrics.get("objective"))]
    if scored:
        pick = max if direction == "maximize" else min
        best = pick(scored, key=lambda r: r.data.metrics["objective"])
        summary["best_objective"] = best.data.metrics["objective"]
        summary.update({f"best_trial_{k}": v for k, v in best.data.metrics.items() if k.startswith("test_")})
        tags.update({"ortflow.best_run_id": best.info.run_id,
                     "ortflow.best_overrides": best.data.tags.get("ortflow.overrides", "")})
        client.log_batch(run_id, params=[Param(f"best.{d.key}", best.data.params.get(d.key, "")[:6000])
                                         for d in dimensions])
        export_id = best.data.tags.get("ortflow.run.export")
        candidate = promotion.Candidate.from_run(client.get_run(export_id)) if export_id else None
        if candidate is None:
            tags["ortflow.registered"] = "false (the best trial exported no model)"
        else:
            version, decision = promotion.register(tracking, candidate)
            tags.update({"ortflow.registered_model": candidate.name, "ortflow.registered_version": str(version)})
            if decision is not None:
                tags.update(decision.tags())
            print(f"ortflow: best trial {best.info.run_id} ({config.optimized_metric}="
                  f"{summary['best_objective']:.6g}) registered as {candidate.name} version {version}"
                  + (f": {decision.decision} ({decision.reason})" if decision is not None else ""))
    tr.set_tags(tracking, run_id, tags)
    tr.log_metrics(tracking, run_id, summary)
    client.set_terminated(run_id, "FINISHED" if finished or not children else "FAILED")
    print(f"ortflow: sweep run {run_id}: {summary}")


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


def record_failed_job(cfg: DictConfig, hydra_cfg: DictConfig, error: BaseException | None) -> str | None:
    """Give a sweep job that failed before creating its run a FAILED run (with the reason) under the sweep run."""
    output_dir = Path(str(hydra_cfg.runtime.output_dir))
    if (output_dir / JOB_RUN_FILE).exists():
        return None  # the job's run exists and is already marked FAILED with its reason
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    from . import tracking as tr

    tracking = tr.setup(cfg)
    parent = _read(Path(str(hydra_cfg.sweep.dir)) / SWEEP_RUN_FILE) or os.environ.get(SWEEP_RUN_ENV)
    tags = {tr.FAILURE_TAG: tr.failure_reason(error) if error is not None else "the job failed",
            "ortflow.overrides": " ".join(hydra_cfg.overrides.task)[:4900] or "(none)"}
    if parent:
        tags[MLFLOW_PARENT_RUN_ID] = parent
    run_id = tracking.client.create_run(tracking.experiment_id, run_name=f"job-{hydra_cfg.job.num}",
                                        tags=tags).info.run_id
    tracking.client.set_terminated(run_id, "FAILED")
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / JOB_RUN_FILE).write_text(run_id)
    return run_id
