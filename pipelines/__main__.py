"""``python -m pipelines <stage|main> key=value ...``: one stage alone in its own MLflow run, or ``main``, the chain
(one parent run, a nested run per stage). The stages are those of the table (pipelines/base/stages.py);
``python -m pipelines.main`` and ``python -m pipelines.<stage>`` are the same commands.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    """Run the app named by the first argument with the rest as Hydra's command line."""
    from .cli import CHAIN, app
    from .base.stages import names

    argv = list(sys.argv[1:] if argv is None else argv)
    choices = (CHAIN, *names())
    usage = f"usage: python -m pipelines {{{','.join(choices)}}} [key=value ...] (<name> --help lists its keys)"
    if argv[:1] in (["-h"], ["--help"]):
        print(f"{usage}\n\n{__doc__.strip()}")
        return
    if not argv or argv[0] not in choices:
        print(usage, file=sys.stderr)
        raise SystemExit(2)
    sys.argv = [sys.argv[0], *argv[1:]]  # argv[0] stays: MLflow tags runs with it (mlflow.source.name)
    app(argv[0])()


if __name__ == "__main__":
    main()
