"""The MLflow side of a ``-m`` sweep (the Hydra callback is :mod:`pipelines.orchestration.sweep_callback`): the
sweep's parent run, a FAILED run for a job that failed before making its own, and the end of the sweep (job counts,
the best trial, its model registered once)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlflow.entities import Param
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from omegaconf import DictConfig

from .. import tracking as tr
from ..base.handoff import JOB_RUN_FILE, SWEEP_RUN_ENV, SWEEP_RUN_FILE
from . import promotion
from .lineage import source_tags
from .promotion import default_direction
from .runs import _mark_failed as mark_failed
from .runs import _status_of as status_of


def create_sweep_run(tracking: tr.Tracking, name: str, tags: dict[str, str]) -> str:
    """A new top-level run ``name`` for a sweep, with the source tags and ``tags``; its id."""
    return tracking.client.create_run(tracking.experiment_id, run_name=name,
                                      tags={**source_tags(), **tags}).info.run_id


def sweep_direction(config: DictConfig) -> str:
    """The sweeper's direction, else the one the optimized metric's name implies (``*_loss`` is minimized)."""
    direction = config.hydra.sweeper.get("direction")
    return str(direction) if direction else default_direction(str(config.optimized_metric))


def not_registered(candidate, decision) -> str:
    """Why a sweep's best trial was not registered, as a sentence (``promotion.register=if_promoted``: only a model
    that takes the alias is)."""
    why = (f"this one does not ({decision.reason})" if decision is not None
           else "promotion is off (promotion.enabled=false): none does")
    return (f"is not registered: promotion.register={candidate.policy} registers only a model that takes "
            f"@{candidate.alias}, and {why}. promotion.register=always registers every best trial.")


def close_sweep(tracking: Any, config: DictConfig, run_id: str, space: Mapping[str, str],
                results: dict[str, Any] | None = None, selection: Any = None) -> None:
    """End the sweep run: job counts, the search ``space`` (parameter -> its distribution, described), the best
    trial by ``objective`` (the optimized, validation metric; ``selection``'s metric when it says why another:
    :func:`pipelines.orchestration.sweep_checks.selection`) with its parameters and test metrics (reported, never
    used to choose), the optimization ``results`` of a shared Optuna study; then the best trial's model is
    registered, once, through the promotion gate."""
    client = tracking.client
    children = client.search_runs([tracking.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run_id}'",
                                  max_results=10000)
    lost = end_lost_attempts(tracking, children)
    finished = [r for r in children if r.info.status == "FINISHED"]
    summary: dict[str, Any] = {"jobs": len(children), "jobs_finished": len(finished),
                               "jobs_failed": sum(r.info.status == "FAILED" for r in children), "jobs_lost": lost}
    sweep_dir = Path(str(config.hydra.sweep.dir))
    if results is not None:  # the whole study, not only this worker's view
        import yaml

        (sweep_dir / "optimization_results.yaml").write_text(yaml.safe_dump(results, sort_keys=False))
    for name in ("search_space.yaml", "optimization_results.yaml"):
        if (sweep_dir / name).exists():
            tr.log_artifact(tracking, run_id, sweep_dir / name, "sweep")
    tags = {"ortflow.search_space": "; ".join(f"{key}: {text}" for key, text in space.items())[:4900] or "(none)"}
    direction, key, metric = sweep_direction(config), "objective", str(config.optimized_metric)
    if selection is not None and selection.why:  # the trials' own losses do not compare: their shared metric
        direction, key, metric = selection.direction, selection.metric, selection.metric
        tags["ortflow.selection"] = selection.why
    scored = [r for r in finished if tr.is_finite(r.data.metrics.get(key))]
    if scored:
        pick = max if direction == "maximize" else min
        best = pick(scored, key=lambda r: r.data.metrics[key])
        summary["best_objective"] = best.data.metrics.get("objective", best.data.metrics[key])
        if key != "objective":
            summary[f"best_{metric}"] = best.data.metrics[key]
        summary.update({f"best_trial_{k}": v for k, v in best.data.metrics.items() if k.startswith("test_")})
        tags.update({"ortflow.best_run_id": best.info.run_id,
                     "ortflow.best_overrides": best.data.tags.get("ortflow.overrides", "")})
        client.log_batch(run_id, params=[Param(f"best.{key}", best.data.params.get(key, "")[:6000])
                                         for key in space])
        export_id = best.data.tags.get("ortflow.run.export")
        candidate = promotion.Candidate.from_run(client.get_run(export_id)) if export_id else None
        if candidate is None:
            tags["ortflow.registered"] = "false (the best trial exported no model)"
        else:
            version, decision = promotion.register(tracking, candidate, sweep=True)
            if decision is not None:
                tags.update(decision.tags())
            best_line = f"ortflow: best trial {best.info.run_id} ({metric}={best.data.metrics[key]:.6g})"
            if version is None:  # promotion.register=if_promoted and it does not beat the holder
                tags["ortflow.registered"] = f"false (promotion.register={candidate.policy}" + (
                    f": {decision.reason})" if decision is not None else ")")
                print(f"{best_line} {not_registered(candidate, decision)}")
            else:
                tags.update({"ortflow.registered_model": candidate.name, "ortflow.registered_version": version})
                print(f"{best_line} registered as {candidate.name} version {version}"
                      + (f": {decision.decision} ({decision.reason})" if decision is not None else ""))
    tr.set_tags(tracking, run_id, tags)
    tr.log_metrics(tracking, run_id, summary)
    client.set_terminated(run_id, "FINISHED" if finished or not children else "FAILED")
    print(f"ortflow: sweep run {run_id}: {summary}")


def fail_sweep(config: DictConfig, run_id: str, exc: BaseException) -> str:
    """End the sweep run ``run_id`` that stopped on ``exc`` before its end (see
    :func:`pipelines.orchestration.sweep_callback.fail_unclosed_sweep`), with the reason; the status it ended with.

    Its job runs still RUNNING whose process is gone end KILLED with the reason; when ``exc`` says the jobs are
    lost with it (``exc.jobs_lost``: the Ray cluster's head lost), every one still RUNNING does (a job left on a
    node that outlives the head is ended by Ray when that node gives up on the head; one that ends first ends its
    own runs)."""
    tracking = tr.setup(config)
    children = tracking.client.search_runs([tracking.experiment_id], max_results=10000,
                                           filter_string=f"tags.mlflow.parentRunId = '{run_id}' and "
                                                         "attributes.status = 'RUNNING'")
    end_lost_attempts(tracking, children, f"lost: {tr.failure_reason(exc)}", alive_too=getattr(exc, "jobs_lost", False))
    mark_failed(tracking, run_id, exc, fluent=False)
    return status_of(exc)


#: the reason given to the runs of a job attempt whose process died without ending them
LOST_REASON = ("lost: the process running this job ended without ending its run (killed, or its node lost); "
               "the launcher may have run the job again (a run of its own)")


def end_lost_attempts(tracking: Any, children: list, reason: str = LOST_REASON, alive_too: bool = False) -> int:
    """End KILLED, with ``reason``, the sweep's job runs still RUNNING whose process is gone (a launcher such as
    Ray runs a job again when its node dies; the lost attempt's runs would stay RUNNING for ever), or every one
    still RUNNING with ``alive_too``, and their RUNNING stage runs; returns how many job runs were ended. The sweep
    closes once every job has returned, so a job run still RUNNING then belongs to a lost attempt."""
    client, count = tracking.client, 0
    for run in children:
        if run.info.status != "RUNNING" or (not alive_too and tr.is_alive(run)):
            continue
        stages = client.search_runs([tracking.experiment_id], max_results=1000,
                                    filter_string=f"tags.mlflow.parentRunId = '{run.info.run_id}' and "
                                                  "attributes.status = 'RUNNING'")
        for lost in [*stages, run]:
            tr.set_tags(tracking, lost.info.run_id, {tr.FAILURE_TAG: reason[:4900]})
            client.set_terminated(lost.info.run_id, "KILLED")
        count += 1
    return count


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


def record_failed_job(cfg: DictConfig, hydra_cfg: DictConfig, error: BaseException | None) -> str | None:
    """Give a sweep job that failed before creating its run a FAILED run (with the reason) under the sweep run."""
    output_dir = Path(str(hydra_cfg.runtime.output_dir))
    if (output_dir / JOB_RUN_FILE).exists():
        return None  # the job's run exists and is already marked FAILED with its reason
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
