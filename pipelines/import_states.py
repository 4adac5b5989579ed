"""``python -m pipelines.import_states --version V STATE ... [key=value ...]``: states trained from a version's
training package outside Python, registered as a new version.

Usage: ``python -m pipelines.import_states --version V [--model NAME] STATE [STATE ...] [key=value ...]``, or
with ``--run RUN_ID`` / ``--experiment NAME --tag key=value`` in place of (or beside) the files. The
states were trained elsewhere (a browser, Node, a device: docs/TRAINING_OUTSIDE_PYTHON.md) from the training package
of a registered version.

The states are read against the version's ``training_package/`` (the export stage's artifact: its format, tensors'
names and shapes, finite values checked); several are averaged weighted by the rows each was trained on (federated
averaging). The result is evaluated on the version's test part, logged and registered through the usual gate
(``promotion``) under the same registered model, with a new ``training_package/``; the run and the version carry
the lineage (``ortflow.lineage.source_version``, ``.source_run_id``, ``.states``: each state's file name, SHA-256,
rows, epochs and steps). A state that cannot be used is refused with the reason; nothing is registered.

``key=value`` arguments are the config overrides the chain ran with (``experiment=``, ``mlflow.tracking_uri=``,
``promotion.*``...): the store, the experiment and the gate come from them; they pass the override guard of
every entry point (:mod:`pipelines.overrides`), and a word naming an existing file is a state even when it holds
``=``. ``--model`` defaults to ``mlflow.registered_model_name``. The config must describe the version's problem:
its ``data.*``, ``model.*``, ``preprocess.*`` and ``loss.*`` params (the run logs the config as its own) are
compared with the source run's, and a difference is refused naming each key.

Everything is checked before the run is made: the version, its problem, its package, each state (a missing
file, a malformed manifest or state, the same state given twice is refused: one line, status 2, no run). The
lineage tag ``ortflow.lineage.states`` holds the records that fit a tag (with ``.states_count``, and
``.states_omitted`` when some do not fit); the full list is the artifact ``lineage/states.json``, the states
themselves are logged under ``states/<index>-<file name>``. ``--verbose`` (or ``ORTFLOW_TRACEBACK=1``) shows the
traceback of an error; Ctrl-C or SIGTERM ends the run KILLED and deletes a version registered from it.

    python -m pipelines.import_states --version 3 client_a.state client_b.state experiment=smoke

States also come from runs of the tracking server (the browser example logs one there:
docs/TRAINING_OUTSIDE_PYTHON.md): ``--run RUN_ID`` (repeatable) and/or ``--experiment NAME --tag key=value``
(repeatable: the runs of that experiment holding every such tag). Each run's state artifact (its tag
``ortflow.state_artifact``, else ``state/trained.state``) is downloaded and then goes the way of a file; its record
names the run (``run_id``) and ``ortflow.lineage.state_runs`` lists the runs. A run's tag
``ortflow.source_version`` (and ``ortflow.source_model``) must name the version imported into; ``--version`` may be
left out when the runs' tags agree on one. A run that does not exist or has no state artifact is refused before any
run is made.

    python -m pipelines.import_states --experiment browser-states --tag ortflow.client=web experiment=smoke
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from .base.errors import UserError
from .base.schema import task_of


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


#: the config keys that must be the source version's: the import logs its config as its own, and reads the
#: source's data, features and model (another problem's names would be logged over them)
SAME_AS_SOURCE = ("data.", "model.", "preprocess.", "loss.")
#: where the full list of imported states is logged (the ``ortflow.lineage.states`` tag holds what fits)
STATES_ARTIFACT = "lineage/states.json"
#: the longest tag value MLflow stores
TAG_LIMIT = 4900
#: the tags of a run that logged a state (the browser example sets them): the state's artifact path, the
#: registered model and version whose package trained it
STATE_ARTIFACT_TAG, SOURCE_MODEL_TAG, SOURCE_VERSION_TAG = ("ortflow.state_artifact", "ortflow.source_model",
                                                            "ortflow.source_version")
#: where a run's state is when the run has no :data:`STATE_ARTIFACT_TAG`
RUN_STATE_ARTIFACT = "state/trained.state"


def import_states(cfg: DictConfig, model: str, version: str | None, states: list[str | Path],
                  work_dir: Path | None = None, runs: list[str] = (), experiment: str | None = None,
                  tags: dict[str, str] | None = None) -> dict[str, Any]:
    """Import ``states`` (paths) and the states of runs (``runs`` ids, and/or the runs of ``experiment`` holding
    ``tags``) for version ``version`` of the registered model ``model`` in one run (see the module's docstring);
    returns the run's metrics with ``run_id`` (and ``registered_version`` when registered). ``version`` None: the
    one the runs' :data:`SOURCE_VERSION_TAG` names.

    Everything is checked before the run is made (the runs and their states, the version, its problem against
    ``cfg``, its package, each state): a refused import leaves no run. Without ``work_dir`` the files go to a
    temporary folder, removed."""
    with contextlib.ExitStack() as stack:
        if work_dir is None:
            work_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ortflow-import-")))
        return _import_states(cfg, model, None if version is None else str(version), [Path(s) for s in states],
                              Path(work_dir), list(runs), experiment, dict(tags or {}))


def _state_runs(tracking, runs: list[str], experiment: str | None, tags: dict[str, str]) -> list:
    """The runs named, then those of ``experiment`` holding every tag of ``tags`` (each once, in that order)."""
    from . import tracking as tr

    try:
        return tr.select_runs(tracking, runs, experiment, tags)
    except LookupError as exc:
        raise StateImportError(str(exc)) from exc


def _download_states(tracking, runs: list, model: str, version: str | None, folder: Path) -> tuple[str, dict]:
    """Each run's state downloaded under ``folder``: ``(version, {path: run id})``; the version is ``version`` or
    the one the runs' tags agree on. A run whose tags name another model or version, or without its state
    artifact, is refused naming the run."""
    from . import tracking as tr

    named = {r.data.tags.get(SOURCE_VERSION_TAG) for r in runs} - {None}
    if version is None:
        if len(named) != 1:
            raise StateImportError(f"the runs name the versions {sorted(named)} ({SOURCE_VERSION_TAG} tags): "
                                   "pass --version")
        version = named.pop()
    origins = {}
    for run in runs:
        run_id, run_tags = run.info.run_id, run.data.tags
        for key, expected in ((SOURCE_VERSION_TAG, version), (SOURCE_MODEL_TAG, model)):
            if run_tags.get(key, expected) != expected:
                raise StateImportError(f"the run {run_id} was trained from {key}={run_tags[key]!r}, not "
                                       f"{expected!r}: select runs of that version")
        artifact = run_tags.get(STATE_ARTIFACT_TAG, RUN_STATE_ARTIFACT)
        try:
            local = tr.download_artifacts(run_id=run_id, artifact_path=artifact, dst_path=folder / run_id)
        except Exception as exc:  # noqa: BLE001 - MLflow's error when the artifact is absent
            raise StateImportError(f"the run {run_id} has no state artifact {artifact!r}: "
                                   f"{str(exc).splitlines()[0][:300]}") from exc
        if not Path(local).is_file():
            raise StateImportError(f"the run {run_id}'s artifact {artifact!r} is a folder, not a state file")
        origins[Path(local)] = run_id
    return version, origins


def _import_states(cfg: DictConfig, model: str, version: str | None, paths: list[Path], work_dir: Path,
                   runs: list[str], experiment: str | None, tags: dict[str, str]) -> dict[str, Any]:
    from . import tracking as tr
    from .base.interrupts import pause_point
    from .data.datasets import Split
    from .execution.bundle import Bundle
    from .execution.runner import execute_stage, prepare
    from .stages.evaluate import deploy_graph, onnx_test_metrics
    from .stages.export import log_training_package, register_model
    from .tracking.lineage import LINEAGE_TAG, tag_version, version_run

    for path in paths:  # before anything else: a typo in a file name costs nothing
        if not path.is_file():
            raise StateImportError(f"the state {str(path)!r} does not exist (or is not a file)")
    tracking = prepare(cfg)
    origins = {}
    if runs or experiment is not None:
        version, origins = _download_states(tracking, _state_runs(tracking, runs, experiment, tags), model,
                                            version, work_dir / "runs")
        paths = paths + list(origins)
    if version is None:
        raise StateImportError("no version to import into: pass --version (or runs tagged ortflow.source_version)")
    try:
        source_run, params = version_run(tracking, model, version)
    except LookupError as exc:
        raise StateImportError(str(exc)) from exc
    bundle = Bundle.from_run(source_run)
    split = Split.load(bundle.path("split", "import_states"))
    if split.task != task_of(cfg):
        raise StateImportError(f"version {version} of {model!r} is a {split.task} model but the config says "
                               f"data.task={task_of(cfg)}: pass the overrides its chain ran with (experiment=, data=)")
    differ = tr.param_differences(params, cfg, prefixes=SAME_AS_SOURCE)
    if differ:
        raise StateImportError(f"version {version} of {model!r} (run {source_run}) was trained on another problem "
                               f"than this config's: {'; '.join(differ)}; pass the overrides its chain ran with "
                               "(its run's ortflow.overrides tag and params)")
    package = _source_package(tracking, model, version, source_run, work_dir / "source")
    loaded, record = _read_states(package, paths, f"the training package of version {version} of {model!r}",
                                  work_dir, origins)
    lineage = {f"{LINEAGE_TAG}source_model": model, f"{LINEAGE_TAG}source_version": version,
               f"{LINEAGE_TAG}source_run_id": source_run, **states_tags(record)}
    if origins:
        lineage[f"{LINEAGE_TAG}state_runs"] = ",".join(origins.values())[:TAG_LIMIT]

    def run(ctx) -> dict:
        import onnx
        from ortflow.package import average_states

        ctx.set_tags(lineage)
        listing = ctx.work_dir / Path(STATES_ARTIFACT).name
        listing.write_text(json.dumps(record, indent=1))
        ctx.log_file(listing, str(Path(STATES_ARTIFACT).parent))
        for entry in record:  # the bytes checked, under unique names: two clients' "model.state" both kept
            ctx.log_file(work_dir / entry["artifact"], "states")
        pause_point("import_states")
        merged = average_states(loaded)
        deploy = deploy_graph(split, merged.get_trained_onnx(), params.get("model.name"))
        metrics = onnx_test_metrics(split, deploy)
        graph = ctx.work_dir / "deploy_model.onnx"
        onnx.save(deploy, graph)
        ctx.log_file(graph, "graphs", entry="deploy_model")
        ctx.log_metrics({"imported_states": len(loaded), "imported_rows": merged.rows})
        log_training_package(ctx, split, merged.estimator(),
                             {"run_id": ctx.run_id, "source_version": version, "source_run_id": source_run})
        result = register_model(ctx, split, deploy, metrics, model)
        if result.get("registered_version"):
            tag_version(tracking, model, result["registered_version"], lineage)
        return result

    return execute_stage("import_states", run, cfg, tracking, bundle, work_dir / "import_states")


def _source_package(tracking, model: str, version: str, source_run: str, folder: Path):
    """The version's training package (downloaded to ``folder``), checked."""
    from . import tracking as tr
    from .stages.export import PACKAGE_ARTIFACT
    from ortflow.package import TrainingPackage

    try:
        local = tr.download_artifacts(run_id=source_run, artifact_path=PACKAGE_ARTIFACT, dst_path=folder)
    except Exception as exc:  # noqa: BLE001 - MLflow's error when the artifact is absent
        raise StateImportError(f"version {version} of {model!r} (run {source_run}) has no {PACKAGE_ARTIFACT}/ "
                               f"artifact: {str(exc).splitlines()[0][:300]}") from exc
    try:
        return TrainingPackage(local)
    except _UNREADABLE as exc:
        raise StateImportError(f"the training package of version {version} of {model!r}: "
                               f"{type(exc).__name__}: {exc}") from exc


#: what reading an untrusted package or state may raise before its format is checked field by field
_UNREADABLE = (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError, OSError)


def _read_states(package, paths: list[Path], where: str, folder: Path,
                 origins: dict[Path, str] | None = None) -> tuple[list, list[dict]]:
    """Each state read and checked against ``package``; ``(states, records)``, a record being a state's file name,
    the artifact it is logged as (its bytes are written there, under ``folder``), its SHA-256, rows, epochs and
    steps, and ``run_id`` for a state of a run (``origins``: path -> run id). The same state given twice is
    refused; ``where`` names the package in messages."""
    from ortflow import TrainingPackageError
    from ortflow.package import load_training_state

    origins = origins or {}
    names = {path: f"{origins[path]}:{path.name}" if path in origins else str(path) for path in paths}
    loaded, record, seen = [], [], {}
    width = len(str(len(paths) - 1))
    for index, path in enumerate(paths):
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest in seen:
            raise StateImportError(f"the state {names[path]!r} is the same state as {seen[digest]!r} (SHA-256 "
                                   f"{digest[:16]}...): each state would be averaged twice as heavily; give it once")
        seen[digest] = names[path]
        try:
            state = load_training_state(package, data)
        except TrainingPackageError as exc:
            raise StateImportError(f"the state {names[path]!r}: {exc}") from exc
        except _UNREADABLE as exc:  # a manifest or header whose structure was not checked
            raise StateImportError(f"the state {names[path]!r} could not be read against {where}: "
                                   f"{type(exc).__name__}: {exc}") from exc
        if state.rows <= 0:
            raise StateImportError(f"the state {names[path]!r} says it was trained on {state.rows} rows")
        loaded.append(state)
        record.append({"file": path.name, "artifact": f"states/{index:0{width}d}-{path.name}", "sha256": digest,
                       "rows": state.rows, "epochs": state.epochs, "steps": state.steps,
                       **({"run_id": origins[path]} if path in origins else {})})
        copy = folder / record[-1]["artifact"]
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(data)
    return loaded, record


def states_tags(record: list[dict]) -> dict[str, str]:
    """The lineage tags of the imported states: ``states`` (a JSON list of the records that fit a tag, in
    order), ``states_count`` and ``states_artifact`` (the full list); ``states_omitted`` when some did not fit."""
    from .tracking.lineage import LINEAGE_TAG

    texts = [json.dumps(r) for r in record]
    shown, size = 0, 2
    for text in texts:
        if size + len(text) + 2 > TAG_LIMIT:
            break
        size += len(text) + 2
        shown += 1
    tags = {f"{LINEAGE_TAG}states": "[" + ", ".join(texts[:shown]) + "]",
            f"{LINEAGE_TAG}states_count": str(len(record)), f"{LINEAGE_TAG}states_artifact": STATES_ARTIFACT}
    if shown < len(record):
        tags[f"{LINEAGE_TAG}states_omitted"] = (f"{len(record) - shown} of {len(record)} states do not fit this "
                                                f"tag: the full list is the artifact {STATES_ARTIFACT}")
    return tags


def split_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(overrides, the rest)``: a ``key=value`` word is an override unless it names an existing file (a state
    whose path holds ``=``) or follows ``--tag``."""
    overrides = [a for k, a in enumerate(argv) if "=" in a and not a.startswith("-") and not Path(a).is_file()
                 and (k == 0 or argv[k - 1] != "--tag")]
    return overrides, [a for a in argv if a not in overrides]


def parse_tags(words: list[str]) -> dict[str, str]:
    """``--tag key=value`` words as a dict; a word without ``=`` is refused."""
    tags = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key or "'" in word or "`" in word:
            raise StateImportError(f"--tag {word!r}: write it key=value, without quotes (a tag of the runs to "
                                   "import)")
        tags[key] = value
    return tags


def main(argv: list[str] | None = None) -> None:
    """The command line: options and state files for argparse, ``key=value`` overrides for the config (checked by
    the override guard of every entry point first)."""
    from .base.errors import exit_if_expected, exit_if_interrupted
    from .base.interrupts import terminate_as_interrupt
    from .cli import quiet_third_party
    from .overrides import check_overrides

    quiet_third_party()
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides, rest = split_arguments(argv)
    parser = argparse.ArgumentParser(prog="python -m pipelines.import_states", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("states", nargs="*", help="state files (ortflow-training-state) to import")
    parser.add_argument("--run", action="append", default=[], help="a run whose state artifact to import")
    parser.add_argument("--experiment", help="import the states of this experiment's runs holding every --tag")
    parser.add_argument("--tag", action="append", default=[], help="key=value: a tag the --experiment runs hold")
    parser.add_argument("--version", help="the registered version whose package trained them (default: the "
                        "one the runs' ortflow.source_version tags name)")
    parser.add_argument("--model", help="the registered model (default: mlflow.registered_model_name)")
    parser.add_argument("--verbose", action="store_true", help="show the traceback of an error")
    args = parser.parse_args(rest)
    if not (args.states or args.run or args.experiment):
        parser.error("give state files, --run RUN_ID or --experiment NAME")
    if args.tag and not args.experiment:
        parser.error("--tag selects runs of an --experiment: name it")
    cfg = None
    try:
        with terminate_as_interrupt():
            tags = parse_tags(args.tag)
            check_overrides(overrides)
            cfg = compose(overrides)
            metrics = import_states(cfg, args.model or str(cfg.mlflow.registered_model_name), args.version,
                                    args.states, runs=args.run, experiment=args.experiment, tags=tags)
    except Exception as exc:
        exit_if_expected(exc, argv, debug=bool(cfg is not None and cfg.get("debug", False)))
        raise
    except KeyboardInterrupt as exc:
        exit_if_interrupted(exc, argv)
        raise
    registered = metrics.get("registered_version")
    print(f"ortflow: states imported: run {metrics['run_id']}; "
          + (f"registered version {registered}" if registered else f"not registered ({metrics.get('not_registered')})"))


if __name__ == "__main__":
    main()
