"""Hydra callback grouping the jobs of a ``-m`` sweep under one MLflow parent run.

``on_multirun_start`` runs once in the launching process, before any job: it creates the tracking store (so
parallel jobs never race to create the sqlite schema), the experiment and the sweep's parent run, whose id it
leaves in ``<sweep dir>/.mlflow_sweep_run_id`` (and the environment) for the jobs to nest under. ``on_job_end``
gives a job that failed before making a run a FAILED run with the reason, so no job goes unrecorded.
``on_multirun_end`` counts the jobs' runs, records the best objective and ends the sweep run.
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

        tracking = tr.setup(config)
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        tags = {"ortflow.sweep": "true", "ortflow.sweep_dir": str(sweep_dir.resolve()),
                "ortflow.sweeper": str(config.hydra.sweeper.get("_target_", "")),
                "ortflow.launcher": str(config.hydra.launcher.get("_target_", "")),
                "ortflow.overrides": " ".join(config.hydra.overrides.task)[:4900] or "(none)"}
        outer = os.environ.get("MLFLOW_RUN_ID")
        if outer:  # mlflow run ... -m: the sweep nests under mlflow run's run
            tags[MLFLOW_PARENT_RUN_ID] = outer
        name = f"sweep-{config.hydra.job.name}-{sweep_dir.name}"
        run = tracking.client.create_run(tracking.experiment_id, run_name=name, tags=tags)
        self.run_id = run.info.run_id
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
        tracking = tr.setup(config)
        children = tracking.client.search_runs(
            [tracking.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run_id}'", max_results=10000)
        finished = [r for r in children if r.info.status == "FINISHED"]
        failed = [r for r in children if r.info.status == "FAILED"]
        summary = {"jobs": len(children), "jobs_finished": len(finished), "jobs_failed": len(failed)}
        values = [r.data.metrics["objective"] for r in finished if tr.is_finite(r.data.metrics.get("objective"))]
        if values:
            direction = str(config.hydra.sweeper.get("direction", "minimize"))
            best = max(values) if "max" in direction else min(values)
            summary["best_objective"] = best
            best_run = next(r for r in finished if r.data.metrics.get("objective") == best)
            tracking.client.set_tag(run_id, "ortflow.best_run_id", best_run.info.run_id)
        tr.log_metrics(tracking, run_id, summary)
        tracking.client.set_terminated(run_id, "FINISHED" if finished or not children else "FAILED")
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
