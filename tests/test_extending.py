"""The walk-throughs "how to add a loss" and "how to add a penalty" of docs/DESIGN.md: a loss or a penalty is one
class; the registry links it to the trainers. The classes here are defined outside ortflow (in this test), so no
other file of ortflow can be what makes them work."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

from ortflow import (
    BaseLearningLoss,
    BaseLearningPenalty,
    LearningRateSGD,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
    get_initializers,
    make_trainable,
    to_onnx,
)
from ortflow.registry import Registered, names
from tolerances import TERM_ROUNDINGS, U32, assert_close, float32_sum_atol

NAME = "half_squared_error_walkthrough"


@pytest.fixture
def half_square():
    """``l = (prediction - label) ** 2 / 2``, registered under NAME for the test only."""

    class HalfSquareLoss(BaseLearningLoss):
        names = (NAME,)

        def __init__(self):
            pass

        def _per_sample(self, b, pred, label):
            diff = b.node("Sub", [pred, label])
            return b.node("Mul", [b.node("Mul", [diff, diff]), b.const(0.5)])

        def _derivative(self, b, pred, label):
            return b.node("Sub", [pred, label])

    yield HalfSquareLoss
    Registered._registry["loss"].pop(NAME)


def _check_losses(est, X, y):
    """The trainer's per-sample losses are the new loss of its predictions; the bound comes from the float32 sum
    that makes each prediction (one term per feature and the intercept) and the roundings of the square."""
    state = est.get_state()
    terms = np.abs(X.astype(np.float64) * state["coef"].astype(np.float64).ravel()).sum(axis=1)
    terms += np.abs(state["intercept"].astype(np.float64)).sum()
    diff = est.predict(X).astype(np.float64) - y
    diff_atol = 2 * float32_sum_atol(terms, X.shape[1] + 1)
    atol = np.abs(diff) * diff_atol + diff_atol**2 + 8 * U32 * diff**2
    np.testing.assert_array_less(np.abs(est.losses(X, y) - 0.5 * diff**2), atol + np.finfo(np.float32).tiny)


def test_a_loss_defined_outside_ortflow_trains_in_both_trainers(half_square, regression_data):
    X, y = regression_data
    assert NAME in names("loss")
    start = to_onnx(LinearRegression().fit(X[:20], np.zeros(20)))

    full = OrtGradientOptimizer(add_loss_output(start, score_name=NAME), max_iter=5, learning_rate=0.02,
                                random_state=0).fit(X, y)
    fwbw = OrtGradientForwardBackwardOptimizer(start, learning_loss=NAME, max_iter=5, learning_rate=0.02,
                                               random_state=0).fit(X, y)
    for est in (full, fwbw):
        losses = [record["train_loss"] for record in est.history_[1:]]
        assert losses[-1] < losses[0] / 2, losses  # it trains: the loss of the fitted start falls
        _check_losses(est, X, y)
    assert isinstance(fwbw._loss_object(), half_square)


PENALTY = "quartic_walkthrough"


@pytest.fixture
def quartic():
    """``c * sum(w ** 4)`` (gradient ``4 c w ** 3``), registered under PENALTY for the test only."""

    class QuarticPenalty(BaseLearningPenalty):
        names = (PENALTY,)

        def __init__(self, c: float = 0.05):
            self.c = c

        def _value(self, ops, weight):
            square = ops.mul(weight, weight)
            return ops.mul(ops.sum(ops.mul(square, square)), ops.const(self.c))

        def _gradient(self, ops, weight, grad):
            return ops.add(grad, ops.mul(ops.mul(ops.mul(weight, weight), weight), ops.const(4.0 * self.c)))

    yield QuarticPenalty
    Registered._registry["penalty"].pop(PENALTY)


def _one_step(kind: str, start, X, y, penalty, lr: float):
    """One SGD step on every row of (X, y) (one batch, one epoch) from the weights of ``start``."""
    common = dict(max_iter=1, batch_size=len(X), shuffle=False, random_state=0,
                  learning_rate=LearningRateSGD(eta0=lr, learning_rate="constant"))
    if kind == "full":
        graph = add_loss_output(start, "squared_error", penalty=penalty)
        return OrtGradientOptimizer(graph, **common).fit(X, y)
    if kind == "fwbw":
        return OrtGradientForwardBackwardOptimizer(start, learning_loss="squared_error",
                                                   learning_penalty=penalty or "none", **common).fit(X, y)
    pytest.importorskip("torch")
    from ortflow.trainers.torch_trainer import TorchTrainer

    return TorchTrainer(start, learning_loss="squared_error", learning_penalty=penalty or "none", **common).fit(X, y)


@pytest.mark.parametrize("kind", ["full", "fwbw", "torch"])
def test_a_penalty_defined_outside_ortflow_trains_in_every_trainer(quartic, regression_data, kind):
    """The penalty moves each weight by ``-lr * 4c w0 ** 3`` more than the same step without it, and the recorded
    loss grows by ``c * sum(w0 ** 4)``: its own rule, in full training (its value in the loss graph), forward-backward
    training (its gradient in the update graph) and the torch trainer."""
    X, y = regression_data
    assert PENALTY in names("penalty")
    start = to_onnx(LinearRegression().fit(X[:20], y[:20] * 3))  # weights far from the optimum and from 0
    lr, c = 0.01, 0.05
    free = _one_step(kind, start, X, y, None, lr)
    penalized = _one_step(kind, start, X, y, quartic(c) if kind == "full" else PENALTY, lr)  # an instance, a name
    w0 = {name: np.asarray(value, np.float64) for name, value in get_initializers(make_trainable(start)).items()}
    n, moved = len(X), free.get_state()
    coef, intercept = w0["coef"].ravel(), float(w0["intercept"].ravel()[0])
    residual = X.astype(np.float64) @ coef + intercept - y
    for name, value in penalized.get_state().items():
        start_w, free_w = w0[name], moved[name].astype(np.float64)
        pull = 4 * c * start_w**3
        terms = (np.abs(residual)[:, None] * np.abs(X)).sum(axis=0).reshape(start_w.shape) if name == "coef" \
            else np.abs(residual).sum().reshape(start_w.shape)
        atol = (lr * float32_sum_atol(2 / n * terms, n)
                + TERM_ROUNDINGS * U32 * (2 * np.abs(start_w) + 2 * np.abs(free_w - start_w) + lr * np.abs(pull)))
        assert_close(value.astype(np.float64) - free_w, -lr * pull, rtol=0, atol=atol, err_msg=f"{kind} {name}")
    added = c * sum(float((w**4).sum()) for w in w0.values())
    loss_atol = 2 * float32_sum_atol((residual**2).sum() / n, n) + float32_sum_atol(added, 16)
    delta = penalized.history_[-1]["train_loss"] - free.history_[-1]["train_loss"]
    assert abs(delta - added) <= loss_atol, (kind, delta, added)
    assert added > 100 * loss_atol  # the penalty is far above the roundings: the check can fail
