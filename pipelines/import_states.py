"""``python -m pipelines.import_states --version V STATE ... [key=value ...]``: states trained from a version's
training package outside Python, registered as a new version.

Usage: ``python -m pipelines.import_states --version V [--model NAME] STATE [STATE ...] [key=value ...]``. The
states were trained elsewhere (a browser, Node, a device: docs/TRAINING_OUTSIDE_PYTHON.md) from the training package
of a registered version.

The states are read against the version's ``training_package/`` (the export stage's artifact: its format, tensors'
names and shapes, finite values checked); several are averaged weighted by the rows each was trained on (federated
averaging). The result is evaluated on the version's test part, logged and registered through the usual gate
(``promotion``) under the same registered model, with a new ``training_package/``; the run and the version carry
the lineage (``ortflow.lineage.source_version``, ``.source_run_id``, ``.states``: each state's file name, SHA-256,
rows, epochs and steps). A state that cannot be used ends the run FAILED with the reason; nothing is registered.

``key=value`` arguments are the config overrides the chain ran with (``experiment=``, ``mlflow.tracking_uri=``,
``promotion.*``...): the store, the experiment and the gate come from them. ``--model`` defaults to
``mlflow.registered_model_name``.

    python -m pipelines.import_states --version 3 client_a.state client_b.state experiment=smoke
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from .base.errors import UserError


class StateImportError(UserError, ValueError):
    """A version without a training package, or states that do not fit it."""

    hint = "states come from the version's training_package/ artifact (docs/TRAINING_OUTSIDE_PYTHON.md)"


def compose(overrides: list[str]) -> DictConfig:
    """The pipelines' config (conf/config.yaml) with ``overrides``, as the entry points compose it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from .base.resolvers import register_configs
    from .base.schema import CONFIG_DIR, follow_task

    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = hydra_compose("config", overrides=list(overrides))
    follow_task(cfg)
    return cfg


def import_states(cfg: DictConfig, model: str, version: str, states: list[str | Path],
                  work_dir: Path | None = None) -> dict[str, Any]:
    """Import ``states`` (paths) for version ``version`` of the registered model ``model`` in one run (see the
    module's docstring); returns the run's metrics with ``run_id`` (and ``registered_version`` when registered)."""
    from . import tracking as tr
    from .data.datasets import Split
    from .execution.bundle import Bundle
    from .execution.runner import execute_stage, job_dir, prepare
    from .stages.evaluate import deploy_graph, onnx_test_metrics
    from .stages.export import PACKAGE_ARTIFACT, log_training_package, register_model
    from .tracking.lineage import LINEAGE_TAG, tag_version, version_run

    tracking = prepare(cfg)
    try:
        source_run, params = version_run(tracking, model, str(version))
    except LookupError as exc:
        raise StateImportError(str(exc)) from exc
    paths = [Path(s) for s in states]

    def run(ctx) -> dict:
        import onnx
        from ortflow import TrainingPackageError
        from ortflow.package import TrainingPackage, average_states, load_training_state

        split = Split.load(ctx.bundle.path("split", ctx.name))
        if split.task != ctx.task:
            raise StateImportError(f"version {version} of {model!r} is a {split.task} model but the config says "
                                   f"data.task={ctx.task}: pass the overrides its chain ran with (experiment=, data=)")
        try:
            folder = tr.download_artifacts(run_id=source_run, artifact_path=PACKAGE_ARTIFACT,
                                           dst_path=ctx.work_dir / "source")
        except Exception as exc:  # noqa: BLE001 - MLflow's error when the artifact is absent
            raise StateImportError(f"version {version} of {model!r} (run {source_run}) has no {PACKAGE_ARTIFACT}/ "
                                   f"artifact: {str(exc).splitlines()[0][:300]}") from exc
        try:
            package = TrainingPackage(folder)
        except TrainingPackageError as exc:
            raise StateImportError(f"the training package of version {version} of {model!r}: {exc}") from exc
        loaded, record = [], []
        for path in paths:
            if not path.is_file():
                raise StateImportError(f"the state {str(path)!r} does not exist")
            data = path.read_bytes()
            try:
                state = load_training_state(package, data)
            except TrainingPackageError as exc:
                raise StateImportError(f"the state {str(path)!r}: {exc}") from exc
            if state.rows <= 0:
                raise StateImportError(f"the state {str(path)!r} says it was trained on {state.rows} rows")
            loaded.append(state)
            record.append({"file": path.name, "sha256": hashlib.sha256(data).hexdigest(), "rows": state.rows,
                           "epochs": state.epochs, "steps": state.steps})
        lineage = {f"{LINEAGE_TAG}source_model": model, f"{LINEAGE_TAG}source_version": str(version),
                   f"{LINEAGE_TAG}source_run_id": source_run, f"{LINEAGE_TAG}states": json.dumps(record)}
        ctx.set_tags(lineage)
        for path in paths:
            ctx.log_file(path, "states")
        merged = average_states(loaded)
        deploy = deploy_graph(split, merged.get_trained_onnx(), params.get("model.name"))
        metrics = onnx_test_metrics(split, deploy)
        graph = ctx.work_dir / "deploy_model.onnx"
        onnx.save(deploy, graph)
        ctx.log_file(graph, "graphs", entry="deploy_model")
        ctx.log_metrics({"imported_states": len(loaded), "imported_rows": merged.rows})
        log_training_package(ctx, split, merged.estimator(),
                             {"run_id": ctx.run_id, "source_version": str(version), "source_run_id": source_run})
        result = register_model(ctx, split, deploy, metrics, model)
        if result.get("registered_version"):
            tag_version(tracking, model, result["registered_version"], lineage)
        return result

    return execute_stage("import_states", run, cfg, tracking, Bundle.from_run(source_run),
                         work_dir or job_dir() / "import_states")


def main(argv: list[str] | None = None) -> None:
    """The command line: options and state files for argparse, ``key=value`` overrides for the config."""
    from .base.errors import exit_if_expected
    from .cli import quiet_third_party

    quiet_third_party()
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    parser = argparse.ArgumentParser(prog="python -m pipelines.import_states", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("states", nargs="+", help="state files (ortflow-training-state) to import")
    parser.add_argument("--version", required=True, help="the registered version whose package trained them")
    parser.add_argument("--model", help="the registered model (default: mlflow.registered_model_name)")
    args = parser.parse_args([a for a in argv if a not in overrides])
    cfg = None
    try:
        cfg = compose(overrides)
        metrics = import_states(cfg, args.model or str(cfg.mlflow.registered_model_name), args.version, args.states)
    except Exception as exc:
        exit_if_expected(exc, argv, debug=bool(cfg is not None and cfg.get("debug", False)))
        raise
    registered = metrics.get("registered_version")
    print(f"ortflow: states imported: run {metrics['run_id']}; "
          + (f"registered version {registered}" if registered else f"not registered ({metrics.get('not_registered')})"))


if __name__ == "__main__":
    main()
