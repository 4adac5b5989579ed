"""MLflow behind one boundary: only the modules of pipelines/tracking/ import mlflow (the stages, the chain, the
runner, the CLI and the bundle call pipelines.tracking's functions)."""

from __future__ import annotations

import ast
from pathlib import Path

PIPELINES = Path(__file__).resolve().parent.parent / "pipelines"


def _imports_mlflow(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(name == "mlflow" or name.startswith("mlflow.") for name in names):
            lines.append(node.lineno)
    return lines


def test_only_the_tracking_package_imports_mlflow():
    outside = {str(path.relative_to(PIPELINES.parent)): lines for path in sorted(PIPELINES.rglob("*.py"))
               if (PIPELINES / "tracking") not in path.parents and (lines := _imports_mlflow(path))}
    assert not outside, f"import mlflow outside pipelines/tracking/ (file: lines): {outside}"
    inside = [p for p in (PIPELINES / "tracking").glob("*.py") if _imports_mlflow(p)]
    assert len(inside) >= 5  # the walk sees imports: the package itself does import mlflow


def test_code_outside_the_tracking_package_never_reaches_for_the_mlflow_client():
    """Outside pipelines/tracking/, a ``Tracking`` is passed around, its MLflow client (``.client``) never used."""
    uses = {str(path.relative_to(PIPELINES.parent)): [node.lineno for node in ast.walk(ast.parse(path.read_text()))
                                                       if isinstance(node, ast.Attribute)
                                                       and node.attr in ("client", "_client")]
            for path in sorted(PIPELINES.rglob("*.py")) if (PIPELINES / "tracking") not in path.parents}
    assert not {k: v for k, v in uses.items() if v}, uses
