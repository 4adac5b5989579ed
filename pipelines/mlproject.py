"""``mlflow run`` entry: ``python -m pipelines.mlproject <stage> <overrides>``; ``--write`` regenerates MLproject.

``MLproject``'s entry points are ``main`` and one per stage of the table (pipelines/stages/__init__.py), each
running this module: ``python -m pipelines.mlproject --write`` writes them from the table (:func:`mlproject_text`;
a test checks the committed file is what the table gives).

MLflow quotes each ``-P`` value as one shell word, so ``-P overrides="trainer=fwbw trainer.max_iter=5"`` reaches
the command as a single argument; this splits such arguments back into Hydra overrides and runs the stage's
Hydra app (which finds MLFLOW_RUN_ID and logs into mlflow run's run). The app checks the overrides first
(:mod:`pipelines.overrides`): a caller of ``mlflow run`` picks values, never code (``_target_``, callbacks).

``mlflow run .`` given no ``--experiment-name``/``--experiment-id`` creates its run in MLflow's Default experiment
(id 0) before the project starts. The pipelines then log where ``python -m pipelines.main`` logs
(``mlflow.experiment_name``, ``ortflow`` by default), in runs of their own linked to mlflow run's run by tags
(:func:`pipelines.tracking.link_mlflow_run`); with an experiment named, they log into mlflow run's run.

Every entry point takes one parameter, ``overrides``. ``mlflow run . -P trainer.max_iter=5`` (another key) is not
refused by MLflow: it creates its run with ``trainer.max_iter`` as a parameter, then appends ``--trainer.max_iter 5``
to the command. MLflow offers no way to refuse it before the run exists, so :func:`main` refuses such parameters
first (:class:`MlflowRunParameterError`: one line naming them and the ``-P overrides=...`` to write, status 2) and
marks mlflow run's run (:func:`pipelines.tracking.mark_refused_mlflow_run`: named ``refused-parameters``, FAILED,
the reason as its description), so it cannot read as a run of those settings. It cannot be deleted: mlflow run
ends its run itself once the command exits, and fails with a traceback when that run is deleted.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from .base.handoff import OUTER_RUN_ENV
from .cli import CHAIN, app
from .base.errors import USER_ERROR_STATUS, UserError, report
from .stages import names

#: the MLproject file, at the repository root
MLPROJECT = Path(__file__).resolve().parent.parent / "MLproject"
_HEADER = """\
# mlflow run . --env-manager local -P overrides="trainer=fwbw trainer.max_iter=5"
# mlflow run . -e train --env-manager local -P overrides="source.run_id=<an add_loss run>"
# Every entry point takes Hydra overrides as one string; the chain and each stage log into mlflow run's run.
# Written by `python -m pipelines.mlproject --write` from the stage table (pipelines/stages/__init__.py).
name: ortflow

python_env: python_env.yaml

entry_points:
"""
#: MLflow's Default experiment, where ``mlflow run`` puts its run when it was given no experiment
DEFAULT_EXPERIMENT_ID = "0"


def own_experiment(environ: dict = os.environ) -> None:  # noqa: B006 - the process environment, on purpose
    """Under ``mlflow run`` given no experiment: hide its Default experiment and run from the pipelines (they log
    into ``mlflow.experiment_name``) and keep the run's id in :data:`OUTER_RUN_ENV`, to be linked."""
    if (environ.get("MLFLOW_RUN_ID") and environ.get("MLFLOW_EXPERIMENT_ID") == DEFAULT_EXPERIMENT_ID
            and not environ.get("MLFLOW_EXPERIMENT_NAME")):
        environ[OUTER_RUN_ENV] = environ.pop("MLFLOW_RUN_ID")
        environ.pop("MLFLOW_EXPERIMENT_ID")


class MlflowRunParameterError(UserError, ValueError):
    """``mlflow run -P <key>=<value>`` with a key other than ``overrides``; the message names it."""

    hint = "every entry point of MLproject takes one parameter: mlflow run . -P overrides=\"key=value key=value\""


def refuse_extra_parameters(stage: str, argv: list[str], environ: dict = os.environ) -> None:  # noqa: B006
    """Under ``mlflow run`` (``MLFLOW_RUN_ID`` set), ``argv`` is ``[overrides, --key, value, ...]``: MLflow appends
    a ``--key value`` pair for each ``-P`` key the entry point does not declare. Refuse them, after marking
    the run mlflow run made with them (see the module's docstring)."""
    run_id = environ.get("MLFLOW_RUN_ID")
    if not run_id or len(argv) <= 1:
        return
    extra = argv[1:]
    if not all(key.startswith("--") for key in extra[::2]):  # not what mlflow run writes: left to the guard
        return
    pairs = [f"{key[2:]}={value}" for key, value in zip(extra[::2], extra[1::2] + [""] * (len(extra) % 2))]
    given = " ".join([*shlex.split(argv[0]), *pairs]) if argv[0] else " ".join(pairs)
    keys = ", ".join(repr(pair.split("=", 1)[0]) for pair in pairs)
    error = MlflowRunParameterError(
        f"mlflow run -P {' -P '.join(pairs)}: entry point {stage!r} takes one parameter, overrides (Hydra overrides "
        f"in one string), not {keys}; write -P overrides={shlex.quote(given)}")
    try:
        from .tracking import REFUSED_RUN_NAME, mark_refused_mlflow_run

        mark_refused_mlflow_run(run_id, f"{type(error).__name__}: {error}")
        error.args = (f"{error}; nothing ran: mlflow run's run {run_id} is named {REFUSED_RUN_NAME!r}",)
    except Exception as exc:  # noqa: BLE001 - the refusal is what the user must see
        error.args = (f"{error}; mlflow run's run {run_id} could not be marked ({type(exc).__name__}: {exc})",)
    report(error)
    raise SystemExit(USER_ERROR_STATUS)


def entry_points() -> tuple[str, ...]:
    """``main`` (the chain), then the stages of the table."""
    return (CHAIN, *names())


def mlproject_text() -> str:
    """The MLproject file the stage table gives: one entry point per :func:`entry_points`."""
    return _HEADER + "".join(
        f"  {name}:\n    parameters:\n      overrides: {{type: string, default: \"\"}}\n"
        f"    command: \"python -m pipelines.mlproject {name} {{overrides}}\"\n" for name in entry_points())


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--write"]:
        MLPROJECT.write_text(mlproject_text())
        print(f"wrote {MLPROJECT} ({', '.join(entry_points())})")
        return
    if not argv or argv[0] not in entry_points():
        print(f"usage: python -m pipelines.mlproject {{{','.join(entry_points())}}} [overrides ...] | --write",
              file=sys.stderr)
        raise SystemExit(2)
    refuse_extra_parameters(argv[0], argv[1:])
    stage, rest = argv[0], [word for arg in argv[1:] for word in shlex.split(arg)]
    own_experiment()
    sys.argv = [f"pipelines.{stage}", *rest]
    app(stage)()


if __name__ == "__main__":
    main()
