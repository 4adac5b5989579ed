"""Fine-tuning: ``weights_to_train`` takes glob patterns; the layers before the first trained weight form a frozen
prefix computed once per fit, out of the trained graph, and every weight not trained stays bit-identical."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.neural_network import MLPRegressor

import ortflow
from ortflow.validation import check_weights_to_train


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
