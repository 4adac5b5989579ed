"""``ortflow.TorchTrainer``: a prediction graph trained as a torch layer on BaseTrainer's epoch loop."""

import subprocess
import sys

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.neural_network import MLPRegressor

from ortflow import (Checkpoint, ElasticLearningPenalty, LearningRateAdam, LearningRateAdamW,
                     OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer, add_loss_output, to_onnx)

from tolerances import float32_sum_atol  # noqa: E402

torch = pytest.importorskip("torch")

from ortflow.torch import RuleOptimizer  # noqa: E402
from ortflow.trainers.torch_trainer import TorchTrainer  # noqa: E402


@pytest.fixture(scope="module")
def mlp(regression_data):
    X, y = regression_data
    return to_onnx(MLPRegressor(hidden_layer_sizes=(8,), max_iter=1, random_state=0).fit(X, y))


def test_import_ortflow_does_not_import_torch():
    code = "import sys, ortflow, ortflow.trainers.torch_trainer; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_loop_of_the_other_trainers(regression_data, mlp):
    """History, validation, early stopping and the learning rate per epoch come from BaseTrainer."""
    X, y = regression_data
    est = TorchTrainer(mlp, max_iter=30, learning_rate=0.01, lr_schedule="invscaling", validation_fraction=0.2,
                       early_stopping=True, n_iter_no_change=2, tol=10.0, random_state=0).fit(X, y)
    assert est.n_iter_ < 30 and est.stop_training_  # a tolerance of 10: no epoch improves enough
    assert list(est.history_[0]) == ["epoch", "train_loss", "validation_loss", "learning_rate", "time"]
    fwbw = OrtGradientForwardBackwardOptimizer(mlp, max_iter=est.n_iter_, learning_rate=0.01,
                                               lr_schedule="invscaling", validation_fraction=0.2,
                                               random_state=0).fit(X, y)
    assert [r["learning_rate"] for r in est.history_] == [r["learning_rate"] for r in fwbw.history_]
    assert est.score(X, y) > 0
    assert est.get_trained_onnx().graph.output[0].name == mlp.graph.output[0].name


def test_the_loss_is_the_loss_family_s(regression_data, mlp):
    """The reported validation loss is the loss family's (with its penalty), computed again here in numpy."""
    X, y = regression_data
    penalty = ElasticLearningPenalty(l1=0.01, l2=0.02)
    est = TorchTrainer(mlp, max_iter=2, learning_loss="absolute_error", learning_penalty=penalty).fit(
        X, y, validation_data=(X, y))
    pred = est.predict(X)
    weights = est.get_state()
    terms = [np.abs(pred - y) / len(y)] + [np.concatenate([0.01 * np.abs(w).ravel(), 0.02 * np.square(w).ravel()])
                                            for n, w in weights.items() if penalty.penalizes(n)]
    expected = sum(float(t.sum()) for t in terms)
    # float32 sums in the loss graph and in the prediction (MLP rows through 8 hidden units), summed again here
    atol = float32_sum_atol(sum(float(np.abs(t).sum()) for t in terms), sum(t.size for t in terms)) \
        + float32_sum_atol(float(np.abs(pred).mean()), X.shape[1] * 8 + 8)
    np.testing.assert_allclose(est.validation_losses_[-1], expected, rtol=0, atol=atol)


def test_resume_equals_uninterrupted_run(tmp_path, regression_data, mlp):
    X, y = regression_data
    params = dict(learning_rate=LearningRateAdam(eta0=0.005), random_state=3)
    full = TorchTrainer(mlp, max_iter=5, **params).fit(X, y)
    ckpt = tmp_path / "ckpt"
    TorchTrainer(mlp, max_iter=3, callbacks=[Checkpoint(ckpt, every=3)], **params).fit(X, y)
    resumed = TorchTrainer(mlp, max_iter=5, **params).fit(X, y, resume_from=ckpt)
    assert resumed.n_iter_ == 5
    for name, value in full.get_state().items():
        np.testing.assert_array_equal(resumed.get_state()[name], value)
    np.testing.assert_array_equal(resumed.train_losses_, full.train_losses_)


def test_the_optimizer_state_has_one_layout_in_every_trainer(regression_data, mlp):
    """get_optimizer_state names Adam's moments ``m:<weight>``/``v:<weight>`` and counts the updates in ``step`` in
    the three trainers (what their checkpoints hold), each moment shaped like its weight."""
    X, y = regression_data
    params = dict(learning_rate=LearningRateAdam(eta0=0.005), max_iter=2, batch_size=50, shuffle=False)
    trainers = [TorchTrainer(mlp, **params), OrtGradientForwardBackwardOptimizer(mlp, **params),
                OrtGradientOptimizer(add_loss_output(mlp, "squared_error"), **params)]
    states = [t.fit(X, y).get_optimizer_state() for t in trainers]
    weights = trainers[0].weights_to_train_
    assert set(states[0]) == {f"{slot}:{w}" for slot in ("m", "v") for w in weights} | {"step"}
    for state in states:
        assert set(state) == set(states[0])
        assert int(state["step"]) == 2 * len(X) // 50
        for w in weights:
            assert state[f"m:{w}"].shape == state[f"v:{w}"].shape == trainers[0].get_state()[w].shape
            assert np.abs(state[f"v:{w}"]).max() > 0  # trained moments, not the zeros they start from


def test_the_optimizer_comes_from_the_learning_rate_object():
    params = [torch.nn.Parameter(torch.zeros(2))]
    adamw = RuleOptimizer(params, LearningRateAdamW(eta0=0.1, weight_decay=0.5))
    assert isinstance(adamw, RuleOptimizer) and adamw.rate.weight_decay == 0.5
    assert adamw.param_groups[0]["lr"] == 0.1
    assert RuleOptimizer(params, LearningRateAdam()).param_groups[0]["lr"] == LearningRateAdam().eta0


def test_refused_settings_name_themselves(regression_data, mlp):
    X, y = regression_data
    with pytest.raises(ValueError, match="device='cuda': TorchTrainer runs on 'cpu' only"):
        TorchTrainer(mlp, device="cuda").fit(X, y)
    with pytest.raises(TypeError, match="gradients"):
        TorchTrainer(mlp, gradients="ortflow")
    assert clone(TorchTrainer(mlp, max_iter=3)).get_params()["max_iter"] == 3
