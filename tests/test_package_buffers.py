"""Issue 47 item 7: every graph of a training package runs on a GPU through WebGPU (onnxruntime-web's WebGPU
execution provider): no node binds more than ``MAX_BUFFERS`` (8) tensors, inputs and outputs together (WebGPU's
default storage-buffer limit per shader: a ``Split``/``Concat`` of a 12-tensor state needs 13, and onnxruntime-web's
JSEP build then returns zeros), whatever the model's size; the gradient's batch-size counts are float ops the device
runs (``Size``, int64 ``Div`` and ``Cast`` fall back to the CPU there), constants in the unrolled graphs' fixed
batches. The rewrites keep every value: the rewritten graphs give the raw step's outputs bit for bit on the CPU.
The WebGPU runs themselves: tests/test_js_webgpu.py (headless Chromium).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from sklearn.neural_network import MLPRegressor

import ortflow
from ortflow import LearningRateAdam, OrtGradientOptimizer, add_loss_output, to_onnx
from ortflow._ort import InferenceSession
from ortflow.autodiff.training import training_step
from ortflow.package.graphs import IR_VERSION, MAX_BUFFERS, device_counts, wide_nodes, with_ir, within_buffers
from sklearn_fit import quiet_fit

#: ops whose int64 results a WebGPU device does not compute (the batch-size arithmetic of a gradient)
HOST_ONLY = {"Size"}


def _mlp(hidden: tuple[int, ...], features: int = 5, rows: int = 40):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((rows, features)).astype(np.float32)
    y = (X.sum(axis=1) / 3).astype(np.float32)
    mlp = quiet_fit(MLPRegressor(hidden_layer_sizes=hidden, max_iter=2, random_state=0), X, y)
    return add_loss_output(to_onnx(mlp), "squared_error"), X, y


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})


@pytest.mark.parametrize("hidden", [(8,), (4,) * 12])
def test_no_node_of_a_package_binds_more_than_eight_tensors(tmp_path, hidden):
    """An MLP with Adam (3 state tensors per weight: 12 for one hidden layer, 78 for twelve) and unrolled graphs up
    to 32 steps (32 losses concatenated, 32 batches split): every node of every graph within the bound, no ``Size``
    left, the unrolled graphs' counts constants."""
    onx, _, _ = _mlp(hidden)
    est = OrtGradientOptimizer(onx, batch_size=4, learning_rate=LearningRateAdam(eta0=0.01))
    folder = ortflow.export_training_package(est, tmp_path / "pkg", max_unrolled=32)
    graphs = sorted(Path(folder).glob("*.onnx"))
    assert {"step.onnx", "step_flat.onnx", "steps_32.onnx", "predict.onnx", "loss.onnx"} <= {p.name for p in graphs}
    state = len(onnx.load(folder / "step.onnx").graph.output) - 1
    assert state == 3 * 2 * (len(hidden) + 1)
    for path in graphs:
        model = onnx.load(path)
        assert wide_nodes(model) == [], path.name
        assert max(len([x for x in (*n.input, *n.output) if x]) for n in model.graph.node) <= MAX_BUFFERS
        if path.name.startswith("step"):
            ops = {n.op_type for n in model.graph.node}
            assert not ops & HOST_ONLY, (path.name, ops & HOST_ONLY)
        if path.name.startswith("steps_"):  # fixed batches: the counts are constants, no ones summed
            assert not [n for n in model.graph.node if n.op_type == "Expand" and "/ones" in n.output[0]], path.name


def test_the_rewritten_step_gives_the_raw_steps_outputs_bit_for_bit():
    """The raw step (a 13-input Concat's worth of state, a mean's count from ``Size``), rewritten by
    ``device_counts`` (symbolic batch, and fixed batch) and ``within_buffers``, on a full and a short batch."""
    onx, X, y = _mlp((8, 6))
    weights = [i.name for i in onx.graph.initializer if i.data_type == TensorProto.FLOAT]
    raw = with_ir(training_step(onx, weights, optimizer=LearningRateAdam(eta0=0.01)))
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in onx.graph.initializer}
    rng = np.random.default_rng(1)
    for rows in (16, 5):
        feeds = {"X": X[:rows], "label": y[:rows].reshape(-1, 1), "learning_rate": np.array(0.01, np.float32),
                 "step": np.array(3, np.float32)}
        for i in raw.graph.input:
            if i.name not in feeds:  # a weight, or a moment (positive for v)
                base = inits.get(i.name[:-2] if i.name.endswith(("_m", "_v")) else i.name)
                feeds[i.name] = (inits[i.name] if i.name in inits else
                                 np.abs(rng.standard_normal(base.shape)).astype(np.float32) * 0.1)
        expected = _run(raw, feeds)
        for rewritten in (within_buffers(device_counts(raw)), device_counts(raw, rows)):
            assert not {n.op_type for n in rewritten.graph.node} & HOST_ONLY
            for got, want in zip(_run(rewritten, feeds), expected):
                np.testing.assert_array_equal(got, want)


def test_wide_nodes_become_trees_of_the_same_values():
    """A ``Split`` into 20, a ``Concat`` of 20 and a ``Sum`` of 20 (what a gradient sums for a tensor read 20
    times): the rewritten graph within the bound, the same outputs bit for bit (the sum in the same order)."""
    n = 20
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3 * n])
    pieces = [f"p{i}" for i in range(n)]
    sizes = helper.make_tensor("sizes", TensorProto.INT64, [n], [3] * n)
    nodes = [helper.make_node("Split", ["x", "sizes"], pieces, axis=0),
             helper.make_node("Concat", pieces[::-1], ["cat"], axis=0),
             helper.make_node("Sum", pieces, ["sum"])]
    graph = helper.make_graph(nodes, "wide", [x], [helper.make_tensor_value_info("cat", TensorProto.FLOAT, [3 * n]),
                                                     helper.make_tensor_value_info("sum", TensorProto.FLOAT, [3])],
                              [sizes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION)
    assert len(wide_nodes(model)) == 3
    narrow = within_buffers(model)
    onnx.checker.check_model(narrow)
    assert wide_nodes(narrow) == [] and within_buffers(narrow) is narrow
    feeds = {"x": np.random.default_rng(0).standard_normal(3 * n).astype(np.float32) * 1e3}
    for got, want in zip(_run(narrow, feeds), _run(model, feeds)):
        np.testing.assert_array_equal(got, want)


def test_a_convolutional_package_is_within_the_bound(tmp_path):
    """The exported LeNet (PyTorch, Adam): every graph within the bound; in the unrolled graphs (fixed batches) the
    max pools' gradients' ``Size`` of their input is a constant too."""
    from js_support import make_package

    folder, _, _ = make_package("lenet", "adam", tmp_path / "lenet")
    for path in sorted(folder.glob("*.onnx")):
        model = onnx.load(path)
        assert wide_nodes(model) == [], path.name
        if path.name.startswith("steps_"):
            assert not {n.op_type for n in model.graph.node} & HOST_ONLY, path.name
