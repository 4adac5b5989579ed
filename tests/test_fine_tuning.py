"""Fine-tuning: ``weights_to_train`` takes glob patterns; the layers before the first trained weight form a frozen
prefix computed once per fit, out of the trained graph, and every weight not trained stays bit-identical."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.neural_network import MLPRegressor

import ortflow
from ortflow.runtime.validation import check_weights_to_train


@pytest.fixture(scope="module")
def mlp():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 6)).astype(np.float32)
    y = (np.sin(X[:, 0]) + X[:, 1] * X[:, 2]).astype(np.float32)
    with pytest.warns(Warning):  # a deliberately short start (ConvergenceWarning)
        start = MLPRegressor(hidden_layer_sizes=(16, 8), max_iter=20, random_state=0).fit(X, y)
    return X, y, ortflow.to_onnx(start, X)


def test_patterns_select_the_float_weights_they_match(mlp):
    onx = mlp[2]
    assert check_weights_to_train(onx, ["*_2"]) == ["coef_2", "intercept_2"]
    assert check_weights_to_train(onx, ["coef_[12]", "intercept_2"]) == ["coef_1", "coef_2", "intercept_2"]
    with pytest.raises(ValueError, match=r"unknown initializers \['head\.\*'\] \(nothing matches\)"):
        check_weights_to_train(onx, ["head.*"])


@pytest.mark.parametrize("trainer", ["full", "fwbw"])
def test_training_the_last_layer_leaves_every_other_weight_identical(mlp, trainer):
    X, y, onx = mlp
    before = ortflow.get_initializers(onx)
    kwargs = dict(weights_to_train=["*_2"], max_iter=10, learning_rate=0.01, batch_size=32, random_state=0)
    if trainer == "full":
        est = ortflow.OrtGradientOptimizer(ortflow.add_loss_output(onx, "squared_error"), **kwargs)
    else:
        est = ortflow.OrtGradientForwardBackwardOptimizer(onx, learning_loss="squared_error", **kwargs)
    est.fit(X, y)
    assert est.train_losses_[-1] < est.train_losses_[0]
    after = ortflow.get_initializers(est.get_trained_onnx())
    for name in ("coef_0", "intercept_0", "coef_1", "intercept_1"):
        np.testing.assert_array_equal(after[name], before[name])
    assert not np.array_equal(after["coef_2"], before["coef_2"])
    # the frozen layers are computed once, not in the trained graph: it starts at the last layer's MatMul
    trained_inputs = {i for node in est._train_model.graph.node for i in node.input}
    assert "coef_0" not in trained_inputs and "coef_1" not in trained_inputs
    assert est._train_model.graph.node[0].op_type == "MatMul"
    # the trained graph keeps the original inputs and outputs
    trained = est.get_trained_onnx()
    assert [i.name for i in trained.graph.input] == [i.name for i in onx.graph.input]
    from ortflow._ort import InferenceSession

    sess = InferenceSession(trained.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"X": X})[0].ravel(), est.predict(X))


def _batch_norm_graph():
    """Y = BatchNormalization(X, scale, bias, mean, var) + var2, where ``var2`` is also a second batch norm's
    variance: read elsewhere than as a statistic, it is a weight."""
    from onnx import TensorProto, helper, numpy_helper

    ones = np.ones(3, dtype=np.float32)
    inits = [numpy_helper.from_array(ones * v, name) for name, v in
             [("scale", 1.0), ("bias", 0.0), ("mean", 0.5), ("var", 2.0), ("var2", 1.5)]]
    nodes = [helper.make_node("BatchNormalization", ["X", "scale", "bias", "mean", "var"], ["B1"]),
             helper.make_node("BatchNormalization", ["B1", "scale", "bias", "mean", "var2"], ["B2"]),
             helper.make_node("Add", ["B2", "var2"], ["Y"])]
    graph = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_batch_norm_statistics_are_not_trained_by_default():
    """A batch norm's running mean and variance (inputs 3 and 4) are statistics: neither the default nor a pattern
    selects them, a name does."""
    from ortflow.graph.editing import batch_norm_statistics

    model = _batch_norm_graph()
    assert batch_norm_statistics(model) == {"mean", "var"}
    assert check_weights_to_train(model, None) == ["scale", "bias", "var2"]
    assert check_weights_to_train(model, ["*"]) == ["scale", "bias", "var2"]
    assert check_weights_to_train(model, ["var"]) == ["var"]
    with pytest.raises(ValueError, match=r"unknown initializers \['mea\*'\]"):
        check_weights_to_train(model, ["mea*"])
    X = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    est = ortflow.OrtGradientForwardBackwardOptimizer(model, learning_loss="squared_error", max_iter=2, batch_size=8,
                                                      learning_rate=0.01)
    est.fit(X, X.sum(axis=1, keepdims=True) + X)
    assert est.weights_to_train_ == ["scale", "bias", "var2"]
    trained = ortflow.get_initializers(est.get_trained_onnx())
    np.testing.assert_array_equal(trained["mean"], np.full(3, 0.5, np.float32))
    np.testing.assert_array_equal(trained["var"], np.full(3, 2.0, np.float32))
