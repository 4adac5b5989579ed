"""Start-up: ``import ortflow`` loads no heavy dependency, and the trainers never import torch."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import ortflow


def _run(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_import_ortflow_loads_neither_onnxruntime_nor_sklearn_nor_torch():
    _run("import sys, ortflow\n"
         "loaded = [m for m in ('onnxruntime', 'sklearn', 'torch', 'skl2onnx') if m in sys.modules]\n"
         "assert not loaded, loaded")


def test_trainers_import_onnxruntime_without_torch_and_leave_torch_importable():
    # torch is hidden from onnxruntime's optional helpers only while they are imported: no mark is left behind
    _run("import sys\n"
         "from ortflow import OrtGradientOptimizer, OrtGradientForwardBackwardOptimizer\n"
         "assert 'onnxruntime' in sys.modules\n"
         "assert 'torch' not in sys.modules, 'torch was imported'\n")


def test_every_public_name_and_submodule_resolves():
    for name in ortflow.__all__:
        assert getattr(ortflow, name) is not None
    assert ortflow.graph.editing.load_model is ortflow.load_model
    assert set(ortflow.__all__) <= set(dir(ortflow))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        ortflow.nothing  # noqa: B018


def test_the_static_imports_repeat_the_one_list_of_public_names():
    """ortflow/__init__.py's TYPE_CHECKING imports (for static analysis) name each public name from the module
    ``_EXPORTS`` loads it from, and no other name."""
    tree = ast.parse(Path(ortflow.__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") ==
                 "TYPE_CHECKING")
    static = {alias.name: node.module for node in block.body for alias in node.names}
    assert static == ortflow._EXPORTS
    assert ortflow.__all__ == sorted(ortflow._EXPORTS)
