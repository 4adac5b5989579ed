"""Hydra callback grouping the jobs of a ``-m`` sweep under one MLflow parent run (its MLflow side is
:mod:`pipelines.tracking.sweep`; this module imports nothing heavy: Hydra instantiates it before every app runs).

``on_multirun_start`` runs once in the launching process, before any job: it checks the sweep
(:func:`pipelines.orchestration.sweep_checks.check_sweep`: the optimized metric, the search space against the
models, the metric that chooses the best trial), creates the tracking store (so
parallel jobs never race to create the sqlite schema), the experiment and the sweep's parent run, whose id it
leaves in ``<sweep dir>/.mlflow_sweep_run_id`` (and the environment) for the jobs to nest under. ``on_job_end``
gives a job that failed before making a run a FAILED run with the reason, so no job goes unrecorded.
``on_multirun_end`` counts the jobs' runs, records the best trial by the optimized metric (by the task's shared
validation metric when the trials train different losses), registers its model
once (the trials themselves register nothing) and ends the sweep run. Workers sharing one Optuna study
(``hydra.sweeper.storage``) share one sweep run: the first creates it, the last to finish closes it.

Hydra calls no callback when the sweeper or the launcher raises (``hydra/launcher=slurm`` where there is no
SLURM): the entry point (:func:`pipelines.cli.app`) then calls :func:`fail_unclosed_sweep`, which ends the sweep
run this process opened FAILED (KILLED on Ctrl-C) with the reason, instead of leaving it RUNNING.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ..base.handoff import SWEEP_RUN_ENV, SWEEP_RUN_FILE
#: the sweep run this process opened and did not close (on_multirun_end not reached): [(config, run id)]
_UNCLOSED: list[tuple[DictConfig, str]] = []


class MlflowSweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from .. import tracking as tr
        from ..tracking.sweep import create_sweep_run
        from .sweep_checks import check_sweep

        # before any run or trial: optimized_metric, the search space against the models, the metric that chooses
        self.selection = _stopping(check_sweep, config)
        tracking = tr.setup(config)
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        tags = {"ortflow.sweep": "true", "ortflow.sweep_dir": str(sweep_dir.resolve()),
                "ortflow.sweeper": str(config.hydra.sweeper.get("_target_", "")),
                "ortflow.launcher": str(config.hydra.launcher.get("_target_", "")),
                "ortflow.overrides": " ".join(config.hydra.overrides.task)[:4900] or "(none)",
                "ortflow.optimized_metric": str(config.optimized_metric),
                "ortflow.selection_metric": self.selection.metric}
        outer = os.environ.get("MLFLOW_RUN_ID")
        if outer:  # mlflow run ... -m: the sweep nests under mlflow run's run
            tags[tr.PARENT_TAG] = outer
        name = f"sweep-{config.hydra.job.name}-{sweep_dir.name}"

        def create() -> str:
            return create_sweep_run(tracking, name, tags)

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
        if self.study is None:  # a study's run is shared: its last worker closes it, whatever this one does
            _UNCLOSED[:] = [(config, self.run_id)]
        print(f"ortflow: sweep parent run {self.run_id} ({tracking.ui_hint(self.run_id)})")
        if self.selection.why:
            print(f"ortflow: {self.selection.why}")

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        from hydra.types import RunMode

        if job_return.status != JobStatus.FAILED or config.hydra.mode != RunMode.MULTIRUN:
            return
        from ..tracking.sweep import record_failed_job

        error = job_return._return_value
        with contextlib.suppress(Exception):  # best effort: the job already failed
            record_failed_job(config, config.hydra, error if isinstance(error, BaseException) else None)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from .. import tracking as tr

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
        from ..tracking.sweep import close_sweep
        from . import study as st

        tracking = tr.setup(config)
        results = st.results(self.study) if self.study is not None else None
        close_sweep(tracking, config, run_id, _search_space(config), results, getattr(self, "selection", None))
        _UNCLOSED.clear()  # closed: a failure in close_sweep leaves it to fail_unclosed_sweep


def _stopping(check: Any, config: DictConfig) -> Any:
    """``check(config)``; its error stops the command: Hydra turns an exception raised in a callback into a warning
    and runs the sweep anyway, so an expected error is reported here and exits (status 2), and any other leaves as
    a SystemExit carrying its traceback (``debug=true``: the traceback of an expected one too)."""
    import sys
    import traceback

    from ..base.errors import exit_if_expected

    try:
        return check(config)
    except Exception as exc:
        exit_if_expected(exc, sys.argv[1:], debug=bool(config.get("debug", False)))
        traceback.print_exc()
        raise SystemExit(1) from exc


def fail_unclosed_sweep(exc: BaseException) -> str | None:
    """End the sweep run this process opened and Hydra left open (the sweeper or the launcher raised ``exc``):
    FAILED with ``ortflow.failure_reason``, KILLED on Ctrl-C. Returns what was closed, for the user (None when no
    sweep run was open)."""
    if not _UNCLOSED:
        return None
    config, run_id = _UNCLOSED.pop()
    from ..tracking.sweep import fail_sweep

    launcher = config.hydra.launcher.get("_target_", "?")
    try:
        status = fail_sweep(config, run_id, exc)
    except Exception as error:  # noqa: BLE001 - the sweep's own failure is what the user must see
        return f"sweep run {run_id} could not be ended ({type(error).__name__}: {error}) (launcher {launcher})"
    return f"sweep run {run_id} ended {status} (launcher {launcher})"


def _search_space(config: DictConfig) -> dict[str, str]:
    """The sweep's parameters, each with its distribution described (none for a sweep that has no distribution to
    describe, e.g. a ``glob()`` sweep of the basic sweeper)."""
    from .study import SearchSpaceError, describe, parse_space

    try:
        dimensions, _ = parse_space(config.hydra.sweeper.get("params"), list(config.hydra.overrides.task))
    except SearchSpaceError:
        return {}
    return describe(dimensions)


def _shared_study(config: DictConfig) -> Any:
    """The Optuna study that several workers share (``hydra.sweeper.storage`` set), else None."""
    storage = config.hydra.sweeper.get("storage")
    if not storage:
        return None
    from . import study as st

    return st.open_study(str(storage), str(config.hydra.sweeper.study_name),
                         str(config.hydra.sweeper.get("direction", "minimize")))
