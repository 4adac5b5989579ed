"""Learning rates step by step against plain numpy implementations of scikit-learn's updates."""

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

from ortflow import to_onnx
from ortflow import (ElasticLearningPenalty, LearningRateAdam, LearningRateSGD, LearningRateSGDNesterov,
                     OrtGradientForwardBackwardOptimizer)
from ortflow.optimizers.schedules import learning_rate_at

RNG = np.random.default_rng(3)
WEIGHTS = {"coef": RNG.normal(size=(4, 1)).astype(np.float32), "bias": RNG.normal(size=1).astype(np.float32)}


def _grads(step):
    rng = np.random.default_rng(100 + step)
    return {k: rng.normal(size=v.shape).astype(np.float32) for k, v in WEIGHTS.items()}


class NumpyNesterov:
    def __init__(self, momentum, nesterov):
        self.momentum, self.nesterov = momentum, nesterov
        self.velocity = {k: np.zeros_like(v, dtype=np.float64) for k, v in WEIGHTS.items()}

    def step(self, weights, grads, lr):
        for k in weights:
            self.velocity[k] = self.momentum * self.velocity[k] - lr * grads[k]
            update = self.momentum * self.velocity[k] - lr * grads[k] if self.nesterov else self.velocity[k]
            weights[k] = weights[k] + update


class NumpyAdam:
    def __init__(self, eta0, beta1, beta2, epsilon):
        self.eta0, self.beta1, self.beta2, self.epsilon, self.t = eta0, beta1, beta2, epsilon, 0
        self.m = {k: np.zeros_like(v, dtype=np.float64) for k, v in WEIGHTS.items()}
        self.v = {k: np.zeros_like(v, dtype=np.float64) for k, v in WEIGHTS.items()}

    def step(self, weights, grads, lr):
        self.t += 1
        lr_t = self.eta0 * np.sqrt(1 - self.beta2**self.t) / (1 - self.beta1**self.t)
        for k in weights:
            self.m[k] = self.beta1 * self.m[k] + (1 - self.beta1) * grads[k]
            self.v[k] = self.beta2 * self.v[k] + (1 - self.beta2) * grads[k] ** 2
            weights[k] = weights[k] - lr_t * self.m[k] / (np.sqrt(self.v[k]) + self.epsilon)


@pytest.mark.parametrize("flat", [True, False])
@pytest.mark.parametrize("nesterov", [True, False])
def test_nesterov_steps_equal_numpy(flat, nesterov):
    rate = LearningRateSGDNesterov(eta0=0.1, momentum=0.8, nesterov=nesterov)
    rate.start(WEIGHTS, "cpu", flat=flat)
    ref, weights = NumpyNesterov(0.8, nesterov), {k: v.astype(np.float64) for k, v in WEIGHTS.items()}
    for step, lr in enumerate([0.1, 0.1, 0.05, 0.05, 0.02]):
        grads = _grads(step)
        for k, g in grads.items():
            rate.grads_[k].write(g)
        rate.step(lr)
        ref.step(weights, grads, lr)
        got = rate.get_weights()
        for k in weights:
            np.testing.assert_allclose(got[k], weights[k], rtol=1e-5, atol=1e-6, err_msg=f"step {step} {k}")
    state = rate.get_state()
    assert int(state["step"]) == 5
    np.testing.assert_allclose(state["velocity:coef"], ref.velocity["coef"], rtol=1e-5, atol=1e-6)


def test_adam_steps_equal_numpy():
    rate = LearningRateAdam(eta0=0.05, beta1=0.8, beta2=0.95, epsilon=1e-7)
    rate.start(WEIGHTS, "cpu")
    ref, weights = NumpyAdam(0.05, 0.8, 0.95, 1e-7), {k: v.astype(np.float64) for k, v in WEIGHTS.items()}
    for step in range(6):
        grads = _grads(step)
        for k, g in grads.items():
            rate.grads_[k].write(g)
        rate.step(rate.value_at(step))  # eta0, bias-corrected in the update
        ref.step(weights, grads, None)
        got = rate.get_weights()
        for k in weights:
            np.testing.assert_allclose(got[k], weights[k], rtol=1e-5, atol=1e-6, err_msg=f"step {step} {k}")
    np.testing.assert_allclose(rate.get_state()["v:bias"], ref.v["bias"], rtol=1e-5)


def test_state_round_trip_restores_the_trajectory():
    a = LearningRateAdam(eta0=0.05)
    a.start(WEIGHTS, "cpu")
    for step in range(3):
        for k, g in _grads(step).items():
            a.grads_[k].write(g)
        a.step(0.0)
    weights, state = a.get_weights(), a.get_state()
    b = LearningRateAdam(eta0=0.05)
    b.start(weights, "cpu")
    b.set_state(state)
    for rate in (a, b):
        for k, g in _grads(9).items():
            rate.grads_[k].write(g)
        rate.step(0.0)
    for k in WEIGHTS:
        np.testing.assert_array_equal(a.get_weights()[k], b.get_weights()[k])
    with pytest.raises(KeyError, match="has no"):
        b.set_state({"step": np.array(1)})


def test_penalty_joins_the_gradient_and_reports_its_value():
    penalty = ElasticLearningPenalty(l1=0.1, l2=0.2, weights=["coef"])
    rate = LearningRateSGD(eta0=0.5, learning_rate="constant")
    rate.start(WEIGHTS, "cpu", penalty=penalty)
    grads = _grads(0)
    for k, g in grads.items():
        rate.grads_[k].write(g)
    rate.step(0.5)
    w = WEIGHTS["coef"].astype(np.float64)
    expected = w - 0.5 * (grads["coef"] + 0.1 * np.sign(w) + 0.4 * w)
    np.testing.assert_allclose(rate.get_weights()["coef"], expected, rtol=1e-5)
    np.testing.assert_allclose(rate.get_weights()["bias"], WEIGHTS["bias"] - 0.5 * grads["bias"], rtol=1e-5)
    np.testing.assert_allclose(rate.penalty_value(), 0.1 * np.abs(w).sum() + 0.2 * (w**2).sum(), rtol=1e-5)


@pytest.mark.parametrize("schedule", ["constant", "invscaling", "optimal", "optimal_sklearn"])
def test_sgd_schedules_follow_sklearn(schedule):
    rate = LearningRateSGD(eta0=0.1, alpha=1e-3, power_t=0.5, learning_rate=schedule)
    for seen in (0, 100, 1000):
        assert rate.value_at(seen) == pytest.approx(learning_rate_at(schedule, 0.1, seen, 0.5, 1e-3))
    if schedule == "invscaling":
        assert rate.value_at(99) == pytest.approx(0.01)
    with pytest.raises(ValueError, match="is not one of"):
        LearningRateSGD(learning_rate="adaptive").check()


def test_estimator_nesterov_epochs_equal_numpy():
    """Two epochs of four batches through the whole trainer (forward, loss, backward, update, schedule)."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(40, 4)).astype(np.float32)
    y = (X @ np.array([0.5, -1.0, 2.0, 0.1]) + 0.4 + rng.normal(scale=0.1, size=40)).astype(np.float32)
    start = LinearRegression().fit(X[:8], np.zeros(8))
    rate = LearningRateSGDNesterov(eta0=0.05, power_t=0.5, learning_rate="invscaling", momentum=0.7)
    est = OrtGradientForwardBackwardOptimizer(to_onnx(start), max_iter=2, batch_size=10, learning_rate=rate,
                                              shuffle=False).fit(X, y)
    weights = {"coef": start.coef_.reshape(4, 1).astype(np.float64), "bias": np.atleast_1d(start.intercept_)}
    ref, losses = NumpyNesterov(0.7, True), []
    for epoch in range(2):
        lr = 0.05 / (epoch * 40 + 1) ** 0.5
        batch_losses = []
        for s in range(0, 40, 10):
            xb, yb = X[s : s + 10].astype(np.float64), y[s : s + 10, None].astype(np.float64)
            diff = xb @ weights["coef"] + weights["bias"] - yb
            batch_losses.append((diff**2).mean())
            grads = {"coef": xb.T @ (2 * diff / 10), "bias": (2 * diff / 10).sum(axis=0)}
            ref.step(weights, grads, lr)
        losses.append(np.mean(batch_losses))
    state = est.get_state()
    np.testing.assert_allclose(state["coef"], weights["coef"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state["intercept"], weights["bias"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(est.train_losses_, losses, rtol=1e-4)
    assert [r["learning_rate"] for r in est.history_] == pytest.approx([0.05, 0.05 / 41**0.5])
    velocity = est.get_optimizer_state()["velocity:coef"]
    np.testing.assert_allclose(velocity, ref.velocity["coef"], rtol=1e-4, atol=1e-6)
