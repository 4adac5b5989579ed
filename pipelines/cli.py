"""The Hydra app of every entry point (:func:`app`), and what it runs once the config is composed (heavy imports
happen here, not before).

Before any heavy import and before any MLflow run, :func:`check_inputs` validates the config and reads the data
a run would load (a missing file, a wrong target column, unusable labels fail here, within a second or two).
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from omegaconf import DictConfig

from .base.errors import UserError, exit_if_expected
from .base.interrupts import terminate_as_interrupt

#: what ``python -m pipelines`` runs besides the stages: the chain
CHAIN = "main"

_THIRD_PARTY = r"(mlflow|pydantic|alembic|sqlalchemy|hydra|omegaconf|google|pkg_resources|setuptools|git)(\.|$)"
#: warnings of other packages known to be harmless here, hidden at the entry points: (category, message, module)
#: regular expressions as ``warnings.filterwarnings`` takes them. Deprecation and future warnings of the tracking
#: and config stacks are for their maintainers; MLflow's two UserWarnings below are advice about model signatures
#: that the deploy model answers otherwise. Warnings of ortflow, scikit-learn (a reference that did not converge),
#: onnxruntime and numpy are never hidden.
HARMLESS_WARNINGS = (
    (DeprecationWarning, "", _THIRD_PARTY),
    (PendingDeprecationWarning, "", _THIRD_PARTY),
    (FutureWarning, "", _THIRD_PARTY),
    (UserWarning, r".*Add type hints to the `predict` method", r"mlflow\."),
    (UserWarning, r"Hint: Inferred schema contains integer column", r"mlflow\."),
)


def is_harmless(message: Warning | str, category: type, filename: str) -> bool:
    """Whether a warning is one of :data:`HARMLESS_WARNINGS` (its module read from the file's path)."""
    import re

    text = str(message)
    parts = re.split(r"[\\/]", filename.removesuffix(".py"))
    module = ".".join(parts[parts.index("site-packages") + 1:]) if "site-packages" in parts else ""
    return any(issubclass(category, cls) and re.match(msg, text, re.I) and (not mod or re.match(mod, module))
               for cls, msg, mod in HARMLESS_WARNINGS)


def _unless_harmless(show: Callable) -> Callable:
    def showwarning(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 - warnings' API
        if not is_harmless(message, category, filename):
            show(message, category, filename, lineno, file, line)

    showwarning._ortflow = True  # type: ignore[attr-defined]
    return showwarning


def quiet_third_party(environ: dict | None = None) -> None:
    """Hide :data:`HARMLESS_WARNINGS` and MLflow's INFO lines (its store's table creation, model validation) and
    its artifact progress bars, so that the console shows ortflow's lines; GitPython's missing-git warning is
    silenced. A variable the user set in the environment wins (``MLFLOW_LOGGING_LEVEL=INFO`` shows them again)."""
    import os
    import warnings

    environ = os.environ if environ is None else environ
    for category, message, module in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    if not getattr(warnings.showwarning, "_ortflow", False):
        # and where a library puts its own filter in front (MLflow shows its UserWarnings 'once' inside
        # catch_warnings), at the moment a warning is shown
        warnings.showwarning = _unless_harmless(warnings.showwarning)
    for name, value in (("MLFLOW_LOGGING_LEVEL", "WARNING"), ("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false"),
                        ("GIT_PYTHON_REFRESH", "quiet")):
        environ.setdefault(name, value)


def app(name: str) -> Callable[[], Any]:
    """The Hydra app of ``python -m pipelines <name>`` (``main``: the chain; else a stage of the table): the
    overrides checked first (:func:`pipelines.overrides.guarded`), then the config composed from ``conf/`` and run.

    Hydra names the job after the task function's module: ``pipelines.<name>``, as when each stage had its own
    entry module (the job name names a sweep's run and Hydra's log file)."""
    quiet_third_party()  # before MLflow is imported: it reads its logging level once
    import hydra

    from .base.resolvers import HELP_APP, register_configs

    from .base.schema import CONFIG_DIR
    from .overrides import guarded

    register_configs()
    HELP_APP["name"] = name  # --help shows this app's keys

    def task(cfg: DictConfig) -> float | None:
        from .base.schema import follow_task

        quiet_third_party()  # again: a launcher's worker process (joblib, Ray) starts here
        follow_task(cfg)  # model= and loss= left unchosen follow data.task, before anything reads them
        return run_main(cfg) if name == CHAIN else run_stage(name, cfg)

    task.__module__ = f"pipelines.{name}"
    hydra_main = hydra.main(config_path=CONFIG_DIR, config_name="config", version_base="1.3")(task)
    return guarded(_closing_sweep(hydra_main))


class SweepError(UserError, RuntimeError):
    """A ``-m`` sweep stopped by its sweeper or launcher (not by a job); the message says why and which run
    recorded it."""

    hint = ("hydra/launcher=slurm needs a SLURM cluster (srun, sbatch); the default launcher runs the jobs here, "
            "hydra/launcher=joblib in parallel")


def _closing_sweep(main: Callable[[], Any]) -> Callable[[], Any]:
    """``main`` (Hydra's entry point); when it raises after a sweep opened its parent run, that run ends FAILED
    with the reason (Hydra calls no callback then, see :mod:`pipelines.orchestration.sweep_callback`) and the error becomes a
    :class:`SweepError` naming it: one line and status 2 instead of a traceback (``debug=true`` shows it)."""

    @functools.wraps(main)
    def entry(*args: Any, **kwargs: Any) -> Any:
        try:
            return main(*args, **kwargs)
        except BaseException as exc:
            from .orchestration.sweep_callback import fail_unclosed_sweep

            closed = fail_unclosed_sweep(exc)
            if closed is None or not isinstance(exc, Exception):
                raise
            error = SweepError(f"the sweep stopped: {type(exc).__name__}: {exc}; {closed}")
            if isinstance(exc, UserError):  # the cause's advice (a lost Ray cluster, an unreachable store...)
                error.hint = exc.hint
            raise error from exc

    return entry



def run_stage(name: str, cfg: DictConfig) -> float | None:
    """``python -m pipelines.<name>``: one stage in its own run, inputs from ``source.run_id``/``source.path``."""

    def stage() -> float | None:
        check_inputs(cfg, [name])
        from .execution.runner import run_standalone
        from .base.stages import stage_function

        return run_standalone(name, stage_function(name), cfg)

    return _guarded(cfg, stage, f"stage {name!r}")


def run_main(cfg: DictConfig) -> float | None:
    """``python -m pipelines.main``: the chain; prints where the runs are and returns the objective."""

    def chain() -> float | None:
        check_inputs(cfg, [str(s) for s in cfg.stages])
        from .orchestration.chain import report, run_chain

        result = run_chain(cfg)
        print(report(result, cfg))
        return result.value

    return _guarded(cfg, chain, "pipeline")


def check_inputs(cfg: DictConfig, stages: list[str]) -> None:
    """The checks that need no MLflow and no training: the config's combinations, and the table that ``convert``
    would read, with its labels for a classifier (raises :class:`~pipelines.base.schema.ConfigError` or
    :class:`~pipelines.base.errors.DataError`; a bundled set's labels are checked by the chain's precheck)."""
    from .base.checks import validate, validate_data
    from .base.schema import DataKind, data_loader

    validate_data(cfg.data)
    if "convert" in stages and data_loader(cfg.data) == DataKind.file.value:
        from .data.tables import read_table

        table = read_table(cfg.data, cfg.get("preprocess"))  # first: listing the registry's names in validate() takes seconds
        if str(cfg.data.task) == "classification":
            from .data.labels import class_labels, target_description

            class_labels(table.y, target_description(cfg.data))
    if "convert" in stages and data_loader(cfg.data) == DataKind.parquet.value:
        from .data.streams import open_stream, split_line

        # the path, the target, the key and the feature columns, from the files' metadata
        print(f"ortflow: {split_line(*open_stream(cfg.data, cfg.get('preprocess')))}")
    validate(cfg)


def _guarded(cfg: DictConfig, body: Callable[[], float | None], what: str) -> float | None:
    """Run ``body``; in a sweep, a failure becomes a FAILED run plus the worst objective instead of an exception,
    elsewhere an expected error ends the command with one line, a hint and status 2 (:mod:`pipelines.base.errors`).

    Raising would stop Hydra's basic sweeper after the batch (leaving the sweep run open) and NaN crashes the
    Optuna sweeper; an infinite value keeps the sweep going and steers Optuna away.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    in_sweep = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        with terminate_as_interrupt():
            return body()
    except Exception as exc:
        if not in_sweep:
            # one line, a hint, status 2 for an expected error (raised as SystemExit, which Hydra lets through
            # without its own report); a bug keeps its traceback
            exit_if_expected(exc, sys.argv[1:], debug=bool(cfg.get("debug", False)))
            raise
        print(f"ortflow {what} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        from .tracking.sweep import record_failed_job

        try:
            record_failed_job(cfg, HydraConfig.get(), exc)  # no-op when the job's run exists (already FAILED)
        except Exception as record_error:  # noqa: BLE001 - report it
            print(f"ortflow: could not record the failed job: {record_error}", file=sys.stderr)
            # no run says this job failed (its store is unreachable from here, e.g. from a Ray worker): fail the
            # Hydra job instead, so that its error reaches the launching process (which stops a basic sweep and
            # fails the sweep run with it) rather than a sweep that looks finished
            raise exc from None
        direction = str(HydraConfig.get().sweeper.get("direction", "minimize"))
        return -float("inf") if "max" in direction.lower() else float("inf")
