"""Independence from the machine's versions (issue 39, seen on a GPU machine with onnx 1.23, onnxruntime 1.31 and
torch 2.11): every graph the project and its tests build states the IR version it is written for, since onnx's
default follows the onnx release (IR 14 with onnx 1.23) and onnxruntime reads only up to its own (13 for 1.31)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from ortflow._ort import max_ir_version

ROOT = Path(__file__).resolve().parent.parent
#: ``make_model`` calls that build a throw-away model to list a (sub)graph's names (never saved nor run), and the
#: one below that shows the fault
NAME_SCANS = {("ortflow/autodiff/builder.py", "att.g"), ("ortflow/autodiff/builder.py", "sub"),
              ("ortflow/graph/editing.py", "att.g"), ("ortflow/convert/ml_op_rewrites.py", "freed_graph"),
              ("tests/test_versions.py", "graph")}


def _make_model_calls_without_ir_version() -> list[str]:
    found = []
    for folder in ("ortflow", "pipelines", "bench", "tests", "examples", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text()
            for node in ast.walk(ast.parse(text)):
                if not isinstance(node, ast.Call):
                    continue
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                if name != "make_model" or any(k.arg == "ir_version" for k in node.keywords):
                    continue
                where = path.relative_to(ROOT).as_posix()
                first = ast.get_source_segment(text, node.args[0]) if node.args else ""
                if (where, first) not in NAME_SCANS:
                    found.append(f"{where}:{node.lineno}")
    return found


def test_every_built_graph_states_its_ir_version():
    assert _make_model_calls_without_ir_version() == []


def test_the_default_ir_version_is_the_fault_the_guard_prevents():
    """What the guard is for, where this machine's onnx shows it: a graph left at onnx's default IR is refused by
    an onnxruntime older than that onnx; one written with ``ir_version=8`` loads on every supported onnxruntime."""
    import onnxruntime as ort

    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [value],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    opsets = [helper.make_opsetid("", 17)]
    ort.InferenceSession(helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString(),
                         providers=["CPUExecutionProvider"])
    default = helper.make_model(graph, opset_imports=opsets)
    if default.ir_version <= max_ir_version():
        pytest.skip(f"this onnx's default IR {default.ir_version} is one this onnxruntime reads "
                    f"(up to {max_ir_version()})")
    with pytest.raises(Exception, match="IR version"):
        ort.InferenceSession(default.SerializeToString(), providers=["CPUExecutionProvider"])
