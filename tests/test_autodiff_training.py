"""One standard-ONNX SGD step graph (ortflow.autodiff.training_step), run batch after batch in a plain
InferenceSession with IO binding, ends with the weights of full training (OrtGradientOptimizer)."""

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

import ortflow
from ortflow.autodiff import TrainingStepRunner, training_step


@pytest.mark.parametrize("score,penalty", [("squared_error", None), ("elastic", {"coef_0": {"l2": 0.01}})])
def test_sgd_steps_reproduce_full_training(regression_data, score, penalty):
    X, y = regression_data
    X, y = X[:95], y[:95].reshape(-1, 1)  # 10 batches of 10 rows, the last of 5
    model = ortflow.to_onnx(LinearRegression().fit(X[:8], y[:8].ravel() + 1.0))
    weight = ortflow.trainable_initializers(model)[0]
    loss = ortflow.add_loss_output(model, score, penalty=None if penalty is None else {weight: penalty["coef_0"]})
    step = training_step(loss)
    assert [i.name for i in step.graph.input][-1] == "learning_rate"
    assert all(n.domain in ("", "ai.onnx") for n in step.graph.node)
    runner = TrainingStepRunner(step, ortflow.get_initializers(loss))
    for _ in range(4):
        losses = runner.epoch([X, y], batch_size=10, learning_rate=0.005)
    assert losses.shape == (10,)
    trainer = ortflow.OrtGradientOptimizer(loss, max_iter=4, batch_size=10, learning_rate=0.005, shuffle=False)
    trainer.fit(X, y)
    expected = ortflow.get_initializers(trainer.get_trained_onnx())
    for name, value in runner.get_weights().items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
        assert not np.allclose(value, ortflow.get_initializers(loss)[name])  # it trained


def test_unknown_optimizer_is_refused(regression_data):
    X, y = regression_data
    loss = ortflow.add_loss_output(ortflow.to_onnx(LinearRegression().fit(X, y)))
    with pytest.raises(ValueError, match="optimizer='adam'"):
        training_step(loss, optimizer="adam")
