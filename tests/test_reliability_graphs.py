"""Probe round 3, exported graphs: what a user's own graph may hold that a converted scikit-learn model never does.
Each case ends in a clear error naming the node or tensor, or in correct training (docs/RELIABILITY.md)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortflow
from ortflow import NotDifferentiableError
from ortflow._ort import TRAINING

RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 3))
TRUTH = np.array([1.0, 2.0, 3.0])
Y = X @ TRUTH


def _graph(nodes, dtype=np.float32, elem=TensorProto.FLOAT, extra_initializers=()):
    weights = [numpy_helper.from_array(np.ones((3, 1), dtype=dtype), "W"),
               numpy_helper.from_array(np.zeros((1,), dtype=dtype), "b"), *extra_initializers]
    graph = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info("X", elem, [None, 3])],
                              [helper.make_tensor_value_info("Y", elem, [None, 1])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _linear(dtype=np.float32, elem=TensorProto.FLOAT):
    return _graph([helper.make_node("MatMul", ["X", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["Y"])],
                  dtype, elem)


def _fit(kind, onx, X=X.astype(np.float32), **kw):
    settings = {"max_iter": 30, "learning_rate": 0.02, "batch_size": 16, "random_state": 0, **kw}
    if kind == "full":
        return ortflow.OrtGradientOptimizer(ortflow.add_loss_output(onx, "squared_error"), **settings).fit(X, Y)
    return ortflow.OrtGradientForwardBackwardOptimizer(onx, learning_loss="squared_error", **settings).fit(X, Y)


@pytest.mark.parametrize("kind", ["full", "fwbw"])
@pytest.mark.parametrize("dtype,elem,name", [(np.float16, TensorProto.FLOAT16, "float16"),
                                             (np.float64, TensorProto.DOUBLE, "double")])
def test_a_float16_or_float64_graph_is_refused_naming_its_type(kind, dtype, elem, name):
    with pytest.raises(ValueError, match=rf"output 'Y' is {name}, not float32: .*convert the graph to float32"):
        _fit(kind, _linear(dtype, elem), X.astype(dtype))


@pytest.mark.parametrize("kind", ["full", "fwbw"])
def test_an_op_without_gradient_deep_in_the_graph_is_named(kind):
    nodes = [helper.make_node("MatMul", ["X", "W"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("CumSum", ["r", "axis"], ["c"], name="running_total"),
             helper.make_node("Add", ["c", "b"], ["Y"])]
    onx = _graph(nodes, extra_initializers=[numpy_helper.from_array(np.array(0, dtype=np.int64), "axis")])
    with pytest.raises(NotDifferentiableError, match=r"node 'running_total' \(op CumSum\)"):
        _fit(kind, onx)


@pytest.mark.parametrize("kind", ["full", "fwbw"])
def test_a_graph_with_an_if_trains_or_names_the_node(kind):
    """ortflow's own gradients have no rule for If (subgraphs): the plain build names it; the training build
    differentiates it with onnxruntime's gradient builder."""
    then = helper.make_graph([helper.make_node("Identity", ["m"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["m"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("MatMul", ["X", "W"], ["m"]),
             helper.make_node("If", ["flag"], ["i"], then_branch=then, else_branch=other, name="branch"),
             helper.make_node("Add", ["i", "b"], ["Y"])]
    onx = _graph(nodes, extra_initializers=[numpy_helper.from_array(np.array(True), "flag")])
    if not TRAINING:
        with pytest.raises(NotDifferentiableError, match=r"node 'branch' \(op If\)"):
            _fit(kind, onx)
        return
    est = _fit(kind, onx)
    assert est.train_losses_[-1] < 0.2 * est.train_losses_[0]


@pytest.mark.parametrize("kind", ["full", "fwbw"])
def test_a_graph_with_a_loop_names_the_node_and_trains_what_follows_it(kind):
    """A Loop (its body doubles the value twice) between the weight and the output: no gradient on either build
    (ortflow has no rule, onnxruntime-training's builder none either), named; the weights after it still train
    with the loop frozen in the prefix."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "v_in"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("MatMul", ["X", "W"], ["m"]),
             helper.make_node("Loop", ["trips", "go", "m"], ["l"], body=body, name="twice"),
             helper.make_node("Add", ["l", "b"], ["Y"])]
    onx = _graph(nodes, extra_initializers=[numpy_helper.from_array(np.array(2, dtype=np.int64), "trips"),
                                            numpy_helper.from_array(np.array(True), "go")])
    with pytest.raises(NotDifferentiableError, match=r"node 'twice' \(op Loop\)"):
        _fit(kind, onx)
    est = _fit(kind, onx, weights_to_train=["b"], max_iter=60)  # W stays ones: Y = 4 * X.sum(1) + b
    assert est.train_losses_[-1] < est.train_losses_[0]
    np.testing.assert_allclose(est.get_state()["b"], [np.mean(Y - 4 * X.sum(axis=1))], rtol=0.05)


@pytest.mark.parametrize("kind", ["full", "fwbw"])
def test_a_graph_file_with_external_data_outside_its_folder_is_refused(kind, model_with_outside_data,
                                                                         regression_data):
    """An exported graph saved with external data names a file: one outside the graph's folder (``../``) is refused
    naming the tensor and the path, before anything is read from it."""
    path = str(model_with_outside_data / "model.onnx")
    X, y = regression_data
    with pytest.raises(ortflow.UnsafePathError, match=r"initializer 'coef' stores its data at '\.\./secret\.bin', "
                                                      r"outside the model's folder"):
        if kind == "full":
            ortflow.OrtGradientOptimizer(ortflow.add_loss_output(path, "squared_error"), max_iter=1).fit(X, y)
        else:
            ortflow.OrtGradientForwardBackwardOptimizer(path, learning_loss="squared_error", max_iter=1).fit(X, y)


@pytest.mark.parametrize("kind", ["full", "fwbw"])
def test_a_weight_shared_by_two_nodes_gets_both_gradients(kind):
    """Y = X W + X W + b: W's gradient is the sum over both uses, so W converges to half the truth."""
    nodes = [helper.make_node("MatMul", ["X", "W"], ["m1"]), helper.make_node("MatMul", ["X", "W"], ["m2"]),
             helper.make_node("Add", ["m1", "m2"], ["m"]), helper.make_node("Add", ["m", "b"], ["Y"])]
    est = _fit(kind, _graph(nodes), max_iter=60)
    np.testing.assert_allclose(est.get_state()["W"].ravel(), TRUTH / 2, atol=0.05)


@pytest.mark.parametrize("kind", ["full", "fwbw"])
@pytest.mark.parametrize("trained", [None, ["scale"]], ids=["all", "scale"])
def test_a_trained_scalar_expanded_to_a_shape_computed_from_the_rows_trains(kind, trained):
    """Issue 45 item 9: ``Expand(scale, Shape(X) * k)`` (a trained scalar broadcast to a shape computed from X's)
    made fit raise ``IndexError ... size 2`` in the batch loop: the frozen prefix cut at ``Shape(X) * k``, a
    2-element tensor, and the loop copied its 'rows'. Such a tensor is now computed in the trainable part."""
    init = [numpy_helper.from_array(np.array(0.5, np.float32), "scale"),
            numpy_helper.from_array(np.array([1, 1], np.int64), "k")]
    nodes = [helper.make_node("Shape", ["X"], ["shp"]), helper.make_node("Mul", ["shp", "k"], ["shp1"]),
             helper.make_node("Expand", ["scale", "shp1"], ["s"]), helper.make_node("Mul", ["X", "s"], ["xs"]),
             helper.make_node("MatMul", ["xs", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["Y"])]
    weights = trained or ["W", "b", "scale"]
    est = _fit(kind, _graph(nodes, extra_initializers=init), max_iter=40, weights_to_train=weights)
    assert np.isfinite(est.train_losses_).all() and est.train_losses_[-1] < est.train_losses_[0]
