"""``mlflow run`` entry: ``python -m pipelines.mlproject <stage> <overrides>``.

MLflow quotes each ``-P`` value as one shell word, so ``-P overrides="trainer=fwbw trainer.max_iter=5"`` reaches
the command as a single argument; this splits such arguments back into Hydra overrides and runs the stage's
Hydra app (which finds MLFLOW_RUN_ID and logs into mlflow run's run). The app checks the overrides first
(:mod:`pipelines.overrides`): a caller of ``mlflow run`` picks values, never code (``_target_``, callbacks).
"""

from __future__ import annotations

import importlib
import shlex
import sys

STAGES = ("main", "convert", "add_loss", "train", "evaluate", "export")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in STAGES:
        raise SystemExit(f"usage: python -m pipelines.mlproject {{{','.join(STAGES)}}} [overrides ...]")
    stage, rest = argv[0], [word for arg in argv[1:] for word in shlex.split(arg)]
    module = importlib.import_module(f"pipelines.{stage}")
    sys.argv = [f"pipelines.{stage}", *rest]
    module.main()


if __name__ == "__main__":
    main()
