"""Start-up: ``import ortflow`` loads no heavy dependency, and the trainers never import torch."""

import subprocess
import sys

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
    assert ortflow.graph.load_model is ortflow.load_model
    assert set(ortflow.__all__) <= set(dir(ortflow))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        ortflow.nothing  # noqa: B018
