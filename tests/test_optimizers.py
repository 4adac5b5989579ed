"""Each optimizer's rule is written once: full training's step graph, forward-backward's update graph and the torch
optimizer take the same steps, and each rule equals its numpy reference (and torch's own optimizer where torch has
the same rule)."""

import warnings

import numpy as np
import pytest
from sklearn.neural_network import MLPRegressor

import ortflow
from ortflow import (
    LearningRateAdam,
    LearningRateAdamW,
    LearningRateRMSProp,
    LearningRateSGD,
    LearningRateSGDNesterov,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
    to_onnx,
)
from ortflow.optimizers.learning_rates import LearningRateAdagrad
from tolerances import assert_close, float32_sum_atol

OPTIMIZERS = {
    "sgd": lambda: LearningRateSGD(eta0=0.05, learning_rate="invscaling", power_t=0.3),
    "nesterov": lambda: LearningRateSGDNesterov(eta0=0.02, momentum=0.8),
    "adam": lambda: LearningRateAdam(eta0=0.01, beta1=0.8, beta2=0.95),
    "adamw": lambda: LearningRateAdamW(eta0=0.01, weight_decay=0.2),
    "rmsprop": lambda: LearningRateRMSProp(eta0=0.005, rho=0.9),
    "adagrad": lambda: LearningRateAdagrad(eta0=0.02),
}
EPOCHS, BATCH = 3, 20


@pytest.fixture(scope="module")
def mlp(regression_data):
    X, y = regression_data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MLPRegressor(hidden_layer_sizes=(6,), max_iter=2, random_state=0).fit(X[:50], y[:50])
    return to_onnx(model)


def _trajectory_atol(start, end, steps):
    """Each step rounds the weight it writes: ``steps`` roundings of the magnitudes the weight went through."""
    return float32_sum_atol(np.abs(start) + np.abs(end), steps)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_trainers_take_the_same_steps(regression_data, mlp, name):
    """Full training against forward-backward training, both on ortflow's gradient graphs; the torch trainer
    against forward-backward training on the gradients its layer uses (onnxruntime's on the training build: two
    gradient graphs round their sums differently, and Adam's division by the running magnitude amplifies that)."""
    X, y = regression_data
    X, y = X[:200], y[:200]
    common = dict(max_iter=EPOCHS, batch_size=BATCH, shuffle=False)
    full = OrtGradientOptimizer(add_loss_output(mlp, "squared_error"), gradients="ortflow",
                                learning_rate=OPTIMIZERS[name](), **common)
    fwbw = OrtGradientForwardBackwardOptimizer(mlp, gradients="ortflow", learning_rate=OPTIMIZERS[name](), **common)
    pairs = [(fwbw, full)]
    try:
        from ortflow.torch import LAYER_GRADIENTS
    except ImportError:  # the plain build's environment has no torch
        pass
    else:
        torch_trainer = ortflow.TorchTrainer(mlp, learning_rate=OPTIMIZERS[name](), **common)
        same_gradients = OrtGradientForwardBackwardOptimizer(mlp, gradients=LAYER_GRADIENTS,
                                                             learning_rate=OPTIMIZERS[name](), **common)
        pairs.append((torch_trainer, same_gradients))
    start = ortflow.get_initializers(mlp)
    steps = EPOCHS * len(X) // BATCH
    for trainer, reference in pairs:
        got, expected = trainer.fit(X, y).get_state(), reference.fit(X, y).get_state()
        for weight, value in expected.items():
            assert np.abs(value - start[weight]).max() > 1e-3, (name, weight)  # it trained
            assert_close(got[weight], value, rtol=1e-5, atol=_trajectory_atol(start[weight], value, steps),
                         err_msg=f"{name} {type(trainer).__name__} {weight}")
        np.testing.assert_allclose(trainer.train_losses_, reference.train_losses_, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_update_graph_equals_the_numpy_reference(name):
    rng = np.random.default_rng(0)
    weights = {"coef": rng.normal(size=(4, 3)).astype(np.float32), "bias": rng.normal(size=3).astype(np.float32)}
    rate = OPTIMIZERS[name]()
    rate.start(weights, "cpu")
    expected, state = {k: v.astype(np.float64) for k, v in weights.items()}, {}
    for step in range(1, 5):
        grads = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in weights.items()}
        for k, g in grads.items():
            rate.grads_[k].write(g)
        lr = rate.value_at(step * 10)
        rate.step(lr)
        new = rate.reference_step(expected, grads, state, lr, step)
        expected = {k: new[k] for k in weights}
        state = {k: v for k, v in new.items() if k not in weights}
        got = rate.get_weights()
        for k in weights:  # a few float32 roundings of the weight and its step per update
            assert_close(got[k], expected[k], rtol=1e-5, atol=float32_sum_atol(np.abs(expected[k]), step),
                         err_msg=f"{name} step {step} {k}")


#: optimizers whose rule is torch's own optimizer: (our class's settings, torch's class and settings)
TORCH_TWINS = {
    "rmsprop": (lambda: LearningRateRMSProp(eta0=0.01, rho=0.9, epsilon=1e-8), "RMSprop", dict(lr=0.01, alpha=0.9, eps=1e-8)),
    "adagrad": (lambda: LearningRateAdagrad(eta0=0.05, epsilon=1e-10), "Adagrad", dict(lr=0.05, eps=1e-10)),
}


@pytest.mark.parametrize("name", sorted(TORCH_TWINS))
def test_the_rule_is_torchs_own_optimizer(name):
    torch = pytest.importorskip("torch")
    from ortflow.torch import RuleOptimizer

    ours_rate, theirs_class, theirs_settings = TORCH_TWINS[name]
    rng = np.random.default_rng(1)
    start = rng.normal(size=(5,)).astype(np.float32)
    ours, theirs = (torch.nn.Parameter(torch.from_numpy(start.copy())) for _ in range(2))
    optimizers = [RuleOptimizer([ours], ours_rate()), getattr(torch.optim, theirs_class)([theirs], **theirs_settings)]
    steps, lr = 5, theirs_settings["lr"]
    for _ in range(steps):
        grad = torch.from_numpy(rng.normal(size=(5,)).astype(np.float32))
        for param, optimizer in zip((ours, theirs), optimizers):
            param.grad = grad.clone()
            optimizer.step()
    # each step moves a weight by at most a few lr (the gradient over its running magnitude): steps roundings of that
    assert_close(ours.detach().numpy(), theirs.detach().numpy(), rtol=1e-6,
                 atol=float32_sum_atol(np.abs(start) + 5 * steps * lr, steps))
    assert not np.allclose(ours.detach().numpy(), start)
