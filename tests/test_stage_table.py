"""The stage table (pipelines/base/stages.py) is the one place stages are declared: MLproject, the config's
stage names, the bundle's files and the entry point follow it, and a new stage is its module plus one line."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from pipelines.base import stages
from pipelines.mlproject import MLPROJECT, entry_points, mlproject_text

REPO_ROOT = Path(__file__).resolve().parent.parent

TOY_MODULE = '''
import json


def toy(ctx):
    path = ctx.work_dir / "toy.json"
    path.write_text(json.dumps({"seen": sorted(ctx.bundle.entries)}))
    ctx.log_file(path, "toy", entry="toy_result")
    ctx.log_metrics({"toy_metric": 7.0})
    return ctx.metrics
'''


def test_mlproject_is_what_the_table_gives():
    import yaml

    assert MLPROJECT.read_text() == mlproject_text(), "run: python -m pipelines.mlproject --write"
    points = yaml.safe_load(MLPROJECT.read_text())["entry_points"]
    assert list(points) == ["main", *stages.names()] == list(entry_points())
    for name, point in points.items():
        assert point["command"] == f"python -m pipelines.mlproject {name} {{overrides}}"
        assert point["parameters"] == {"overrides": {"type": "string", "default": ""}}


def _imports(path: Path) -> set[str]:
    """The modules ``path`` imports, relative imports resolved against its package."""
    package = ["pipelines", *path.parent.relative_to(REPO_ROOT / "pipelines").parts]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def test_no_stage_module_imports_another():
    modules = {s.module_name: s.name for s in stages.TABLE}
    for path in sorted((REPO_ROOT / "pipelines" / "stages").glob("*.py")):
        own = f"pipelines.stages.{path.stem}"
        others = sorted(_imports(path) & (set(modules) - {own}))
        assert not others, f"{path.name} imports the stage module(s) {others}: move what they share out of stages/"


@pytest.fixture
def toy_stage(tmp_path):
    """A stage ``toy`` (a module in tmp_path plus one line of the table), for one test; the schema (whose default
    ``stages`` is the table's) stored again without it afterwards."""
    from pipelines.base.resolvers import register_configs

    (tmp_path / "toy_stage.py").write_text(TOY_MODULE)
    sys.path.insert(0, str(tmp_path))
    table = stages.TABLE
    stages.TABLE = [*table, stages.Stage("toy", "a stage of this test", {"toy_result": "toy.json"}, module="toy_stage")]
    register_configs()
    try:
        yield
    finally:
        stages.TABLE = table
        sys.path.remove(str(tmp_path))
        sys.modules.pop("toy_stage", None)
        register_configs()


def test_a_new_stage_is_its_module_plus_one_table_line(toy_stage, tmp_path, monkeypatch, compose_pipeline,
                                                       sqlite_uri, clean_mlflow_env, capsys):
    from pipelines.execution.bundle import FILES, PRODUCER, Bundle
    from pipelines.base.checks import check_stages
    from pipelines.base.resolvers import stage_listing
    from pipelines.base.schema import ConfigError
    from pipelines.tracking.lineage import STAGE_INPUTS

    # the config: the default stages, their check, the --help listing
    cfg = compose_pipeline()
    assert list(cfg.stages) == ["convert", "add_loss", "train", "evaluate", "export", "toy"]
    check_stages(["convert", "toy"])
    with pytest.raises(ConfigError, match=r"\['toi'\] not among the stages \[.*'export', 'toy'\]"):
        check_stages(["toi"])
    assert "export -> toy" in stage_listing() and "toy        a stage of this test" in stage_listing()
    # the bundle's files, MLproject's entry points; the stage reads no data
    assert FILES["toy_result"] == "toy.json" and PRODUCER["toy_result"] == "toy"
    assert "toy" not in STAGE_INPUTS
    assert entry_points()[-1] == "toy"
    assert '  toy:\n' in mlproject_text() and "python -m pipelines.mlproject toy {overrides}" in mlproject_text()

    # the entry point runs it: python -m pipelines toy, in its own MLflow run
    from pipelines.__main__ import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["pipelines"])
    main(["toy", f"mlflow.tracking_uri={sqlite_uri}", f"hydra.run.dir={tmp_path / 'out'}"])
    out = capsys.readouterr().out
    run_id = out.split("stage 'toy' finished: run ")[1].split()[0]
    import mlflow

    run = mlflow.MlflowClient(sqlite_uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "toy"
    assert run.data.tags["ortflow.stage"] == "toy" and run.data.metrics["toy_metric"] == 7.0
    # a later stage finds its output in the run's manifest
    mlflow.set_tracking_uri(sqlite_uri)
    bundle = Bundle.from_run(run_id)
    assert json.loads(bundle.path("toy_result", "next").read_text()) == {"seen": []}
