"""The house without circles: the modules of ``ortflow/`` and ``pipelines/`` import each other in layers.

The test reads every module's AST and builds the import graph: every ``import``/``from ... import`` of a module of
the two packages, at module level (``if TYPE_CHECKING:`` blocks included) or inside a function. An import names
the module it reads (``from pkg import sub`` names ``pkg.sub`` when ``sub`` is a module, else ``pkg``); the
``__init__`` of a parent package, run on the way, is not counted. It then fails on

- any import circle, in ``ortflow/`` or ``pipelines/``;
- any import from a lower layer of :data:`LAYERS` to a higher one (a layer imports its own and lower layers): in
  ``ortflow/`` too, whose sub-packages are its layers (a training package never imports a trainer);
- a module of ``pipelines/`` that no layer claims (a new sub-package is declared here, in its place).

The stage table (``pipelines/base/stages.py``) loads a stage's module by name (``importlib``) when the stage
runs: the one import upward, declared in the table and not written as an import statement.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ortflow", "pipelines")

#: the layers, top to bottom: name, the files it holds (``dir/`` everything under dir, ``dir/*.py`` the files
#: directly in dir, else one file; the most specific pattern claims a file), what it is
LAYERS: list[tuple[str, tuple[str, ...], str]] = [
    ("entry points", ("pipelines/*.py",),
     "`python -m pipelines.<stage>` (and `.main`, `.mlproject`, `.resend`, `.server`, `.import_states`), the Hydra "
     "app (`cli`), the override guard"),
    ("chain and sweeps", ("pipelines/orchestration/",),
     "the chain and its precheck, the Hydra sweep callback, the shared Optuna study"),
    ("stages", ("pipelines/stages/*.py",), "one module per stage of the table"),
    ("stage runs", ("pipelines/execution/",),
     "one stage in its MLflow run (`runner`), the files stages hand on (`bundle`)"),
    ("tracking", ("pipelines/tracking/",), "everything said to MLflow (the only package importing mlflow)"),
    ("modeling", ("pipelines/modeling/",), "scikit-learn estimators, predictions, metrics, plots"),
    ("data", ("pipelines/data/",), "data sets and the split, tables, class labels"),
    ("base", ("pipelines/base/",),
     "config schema, checks and the ortflow parts it builds, user errors, paths, run-id hand-offs, the stage table "
     "(`stages`), the table of models (`models`)"),
    ("ortflow: public names", ("ortflow/__init__.py",), "`import ortflow`: every public name, loaded on first use"),
    ("ortflow: trainers", ("ortflow/trainers/",),
     "the estimators (full, forward-backward, torch), their loop, parameters, callbacks, checkpoints, predictions"),
    ("ortflow: torch layer", ("ortflow/torch.py",), "a graph as a torch layer, the update rules as a torch optimizer"),
    ("ortflow: package", ("ortflow/package/",),
     "training packages: the format, the writer, the reader, the reference loop (never a trainer)"),
    ("ortflow: training problem", ("ortflow/trainers/problem.py",),
     "what a trainer trains, as one value (`TrainingProblem`): what packages are written from"),
    ("ortflow: engines", ("ortflow/engines/",), "what runs a step: step graphs, forward and backward passes"),
    ("ortflow: data", ("ortflow/data/",), "graph inputs, sources, the portable shuffle, table preprocessing"),
    ("ortflow: autodiff", ("ortflow/autodiff/",), "gradient graphs and one graph per training step"),
    ("ortflow: optimizers", ("ortflow/optimizers/",), "update rules and learning-rate schedules"),
    ("ortflow: objectives", ("ortflow/objectives/",), "losses, penalties, each estimator's loss, add_loss_output"),
    ("ortflow: runtime", ("ortflow/runtime/",), "sessions and their placement, checks, device buffers, guards"),
    ("ortflow: convert", ("ortflow/convert/",), "scikit-learn models to trainable graphs"),
    ("ortflow: graph", ("ortflow/graph/",), "reading, checking and editing graphs; writing nodes"),
    ("ortflow: basics", ("ortflow/_ort.py", "ortflow/exceptions.py", "ortflow/registry.py"),
     "onnxruntime's import, the errors, the registry of names"),
]


def _files() -> list[Path]:
    return sorted(p.relative_to(ROOT) for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _module(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _claims(pattern: str, path: Path) -> int:
    """How specifically ``pattern`` claims ``path`` (0: not at all)."""
    text = path.as_posix()
    if pattern.endswith("/*.py"):
        return len(pattern) if path.parent.as_posix() == pattern[:-len("/*.py")] else 0
    if pattern.endswith("/"):
        return len(pattern) if text.startswith(pattern) else 0
    return 1000 + len(pattern) if text == pattern else 0


def layer_of(path: Path) -> int | None:
    """The index in :data:`LAYERS` of the layer claiming ``path`` (0 is the top), None when none does."""
    best = max(((_claims(pattern, path), index) for index, (_, patterns, _) in enumerate(LAYERS)
                for pattern in patterns), default=(0, None))
    return best[1] if best[0] else None


def _imports(path: Path, modules: set[str]) -> dict[str, list[int]]:
    """The modules of :data:`PACKAGES` that ``path`` imports, each with the lines importing it."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, list[int]] = {}
    for node in ast.walk(ast.parse((ROOT / path).read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import ortflow.graph.editing as g` reads ortflow.graph.editing
                target = target.rpartition(".")[0]
            if target and target != module:
                found.setdefault(target, []).append(node.lineno)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, list[int]]]:
    modules = {_module(p) for p in _files()}
    return {_module(p): _imports(p, modules) for p in _files()}


def _cycles(graph: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_the_walk_sees_imports(graph):
    """A walk that found no imports would pass everything: check it sees what is known to be there."""
    assert "pipelines.base.checks" in graph["pipelines.execution.runner"]
    assert "pipelines.execution.runner" in graph["pipelines.cli"]  # an import inside a function
    assert "pipelines.tracking" in graph["pipelines.orchestration.chain"]  # `from .. import tracking as tr`
    assert "ortflow.graph.editing" in graph["ortflow.convert.ml_op_rewrites"]
    assert sum(map(len, graph.values())) > 150


def test_no_import_circle(graph):
    assert not _cycles(graph), f"modules importing each other in a circle: {_cycles(graph)}"


def test_the_cycle_finder_finds_a_circle():
    circle = {"a": {"b": [1]}, "b": {"c": [1]}, "c": {"a": [1]}, "d": {"a": [1]}}
    assert _cycles(circle) == [["a", "b", "c"]]
    assert _cycles({"a": {"b": [1]}, "b": {}}) == []


def test_every_module_of_the_pipelines_has_a_layer():
    unclaimed = [str(p) for p in _files() if layer_of(p) is None]
    assert not unclaimed, f"modules no layer of tests/test_layering.py LAYERS claims: {unclaimed}"
    unused = [pattern for _, patterns, _ in LAYERS for pattern in patterns
              if not any(_claims(pattern, p) for p in _files())]
    assert not unused, f"LAYERS names files that do not exist: {unused}"


def test_no_import_from_a_lower_layer_to_a_higher_one(graph):
    layer = {_module(p): layer_of(p) for p in _files()}
    upward = [f"{source} ({LAYERS[layer[source]][0]}) imports {target} ({LAYERS[layer[target]][0]}) at line "
              f"{', '.join(map(str, sorted(set(lines))))}"
              for source, targets in sorted(graph.items()) for target, lines in sorted(targets.items())
              if layer[target] < layer[source]]
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_layers_claim_what_they_should():
    assert LAYERS[layer_of(Path("pipelines/base/stages.py"))][0] == "base"
    assert LAYERS[layer_of(Path("pipelines/stages/train.py"))][0] == "stages"
    assert LAYERS[layer_of(Path("pipelines/cli.py"))][0] == "entry points"
    assert LAYERS[layer_of(Path("pipelines/tracking/sweep.py"))][0] == "tracking"
    assert layer_of(Path("hydra_plugins/x.py")) is None


def layer_table() -> str:
    """:data:`LAYERS` as the Markdown table docs/PIPELINES.md shows."""
    rows = [f"| {i + 1} | {name} | {', '.join(f'`{p}`' for p in patterns)} | {what} |"
            for i, (name, patterns, what) in enumerate(LAYERS)]
    return "\n".join(["| # | layer | files | holds |", "|---|---|---|---|", *rows])


def test_the_docs_show_the_layers():
    assert layer_table() in (ROOT / "docs" / "PIPELINES.md").read_text(), (
        "docs/PIPELINES.md must show tests/test_layering.py's LAYERS as:\n" + layer_table())


def test_the_core_top_level_is_small():
    """``ortflow/`` shows its concepts: at most 15 modules or sub-packages at its top level."""
    entries = [p.name for p in (ROOT / "ortflow").iterdir()
               if p.name != "__pycache__" and (p.suffix == ".py" or (p / "__init__.py").is_file())]
    assert len(entries) <= 15, f"ortflow/ holds {len(entries)} modules or sub-packages: {sorted(entries)}"
