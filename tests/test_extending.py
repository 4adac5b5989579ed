"""The walk-through "how to add a loss" of docs/DESIGN.md: a loss is one class; the registry links it to both
trainers. The loss here is defined outside ortflow (in this test), so no other file of ortflow can be what makes
it work."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

from ortflow import (
    BaseLearningLoss,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
    to_onnx,
)
from ortflow.registry import Registered, names
from tolerances import U32, float32_sum_atol

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
