"""relu_as_mask: the Relu rewrite the trainers apply on CPU keeps values and training identical."""

import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from sklearn.neural_network import MLPRegressor

from ortflow import OrtGradientOptimizer, add_loss_output, to_onnx
from ortflow.graph.editing import get_initializers, relu_as_mask, row_sums_as_matmul, trainable_initializers


def _relu_graph(elem_type: int, extra_name: str = "ortflow_relu_zero") -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="first"),
        helper.make_node("Identity", ["h"], [extra_name]),  # a name the rewrite must not reuse
        helper.make_node("Relu", [extra_name], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem_type, [None, 3])],
                              [helper.make_tensor_value_info("y", elem_type, [None, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("elem_type, dtype", [(TensorProto.FLOAT, np.float32), (TensorProto.DOUBLE, np.float64)])
def test_rewritten_relu_gives_the_same_values(elem_type, dtype):
    model = _relu_graph(elem_type)
    new = relu_as_mask(model)
    onnx.checker.check_model(new)
    ops = [n.op_type for n in new.graph.node]
    assert "Relu" not in ops and ops.count("Greater") == 2 and ops.count("Constant") == 1
    x = np.array([[-2.0, -0.0, 0.0], [1e-30, 3.5, np.nan], [-1e-30, 7.0, -5.0]], dtype=dtype)
    before, after = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
                     for m in (model, new))
    np.testing.assert_array_equal(after, before)
    assert after.dtype == dtype


def test_graphs_without_float_relu_are_left_alone():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.INT32, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [2])])
    ints = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert [n.op_type for n in relu_as_mask(ints).graph.node] == ["Relu"]
    no_relu = _relu_graph(TensorProto.FLOAT)
    del no_relu.graph.node[:]
    assert relu_as_mask(no_relu) is no_relu


@pytest.mark.training_build
def test_full_training_matches_the_raw_loop_on_the_unrewritten_graph(regression_data):
    """The trainer (rewritten graph, Mul gradient) and onnxruntime's own loop (Relu, ReluGrad) end equal."""
    from ortflow._ort import OrtValueVector, api, artifacts

    X, y = regression_data
    mlp = MLPRegressor(hidden_layer_sizes=(16, 8), max_iter=1, random_state=0).fit(X, y)
    graph = add_loss_output(to_onnx(mlp))
    epochs, bs, lr = 3, 20, 0.01
    est = OrtGradientOptimizer(graph, max_iter=epochs, batch_size=bs, learning_rate=lr, shuffle=False,
                               gradients="onnxruntime").fit(X, y)
    with tempfile.TemporaryDirectory() as folder:
        training_ops = {n.op_type for n in onnx.load(est.save_onnx_graph(folder)["training_model"]).graph.node}
        assert "ReluGrad" not in training_ops and "Greater" in training_ops
    with tempfile.TemporaryDirectory() as folder:
        artifacts.generate_artifacts(graph, requires_grad=trainable_initializers(graph), frozen_params=[], loss=None,
                                     optimizer=artifacts.OptimType.SGD, artifact_directory=folder)
        assert "ReluGrad" in {n.op_type for n in onnx.load(os.path.join(folder, "training_model.onnx")).graph.node}
        state = api.CheckpointState.load_checkpoint(os.path.join(folder, "checkpoint"))
        module = api.Module(os.path.join(folder, "training_model.onnx"), state,
                            os.path.join(folder, "eval_model.onnx"), "cpu")
        optimizer = api.Optimizer(os.path.join(folder, "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(lr)
    module.train()
    for _ in range(epochs):
        for start in range(0, len(X), bs):
            module._model.train_step([X[start:start + bs], y[start:start + bs].reshape(-1, 1)], OrtValueVector())
            optimizer.step()
            module.lazy_reset_grad()
    trained = est.get_state()
    for name, value in trained.items():
        np.testing.assert_allclose(value, state.parameters[name].data, rtol=1e-4, atol=1e-6, err_msg=name)
    assert not np.allclose(trained["coef_0"], get_initializers(graph)["coef_0"])  # it did train


@pytest.mark.parametrize("opset,keepdims", [(17, 0), (17, 1), (11, 0)])
def test_row_sums_become_a_matmul_by_ones_on_static_matrices(opset, keepdims):
    """row_sums_as_matmul (bias gradients of static training graphs): same values, a MatMul instead."""
    if opset >= 13:
        node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=keepdims)
        inits = [onnx.numpy_helper.from_array(np.array([0], dtype=np.int64), "axes")]
    else:
        node = helper.make_node("ReduceSum", ["x"], ["y"], axes=[0], keepdims=keepdims)
        inits = []
    other = helper.make_node("ReduceSum", ["z"], ["w"], axes=[0], keepdims=0) if opset < 13 else \
        helper.make_node("ReduceSum", ["z", "axes"], ["w"], keepdims=0)
    graph = helper.make_graph([node, other], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 4]),
                                                   helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4] if keepdims else [4]),
                               helper.make_tensor_value_info("w", TensorProto.FLOAT, [4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    new = row_sums_as_matmul(model)
    onnx.checker.check_model(new)
    assert [n.op_type for n in new.graph.node] == ["MatMul", "ReduceSum"]  # the symbolic (None, 4) one is kept
    x = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    before, after = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {
        "x": x, "z": x})[0] for m in (model, new))
    assert after.shape == before.shape == ((1, 4) if keepdims else (4,))
    np.testing.assert_allclose(after, before, rtol=1e-6)
    del model.graph.node[0]
    assert row_sums_as_matmul(model) is model
