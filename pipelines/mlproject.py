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
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from .base.handoff import OUTER_RUN_ENV
from .cli import CHAIN, app
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
    stage, rest = argv[0], [word for arg in argv[1:] for word in shlex.split(arg)]
    own_experiment()
    sys.argv = [f"pipelines.{stage}", *rest]
    app(stage)()


if __name__ == "__main__":
    main()
