"""``partial_fit``: one pass over the given rows per call, continuing from the previous call, as scikit-learn's
SGD estimators have it (a user's own loop over batches of a large table)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

import ortflow


@pytest.fixture(scope="module")
def linear():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 5)).astype(np.float32)
    y = (X @ np.arange(1, 6) + 0.1 * rng.normal(size=300)).astype(np.float32)
    start = LinearRegression().fit(X[:20], rng.normal(size=20))  # a poor start
    return X, y, ortflow.to_onnx(start, X)


def _trainer(kind, onx, **kw):
    if kind == "full":
        return ortflow.OrtGradientOptimizer(ortflow.add_loss_output(onx, "squared_error"), **kw)
    return ortflow.OrtGradientForwardBackwardOptimizer(onx, learning_loss="squared_error", **kw)


@pytest.mark.parametrize("kind", ["full", "fwbw"])
def test_repeated_partial_fit_is_fit(linear, kind):
    """partial_fit over the whole data k times ends with fit's weights after k epochs (same batches, same rates)."""
    X, y, onx = linear
    kw = dict(learning_rate=0.01, batch_size=32, shuffle=False, lr_schedule="invscaling", power_t=0.25)
    fitted = _trainer(kind, onx, max_iter=4, **kw).fit(X, y)
    partial = _trainer(kind, onx, **kw)
    for _ in range(4):
        partial.partial_fit(X, y)
    assert len(partial.history_) == 4
    for a, b in zip(fitted.history_, partial.history_):
        assert a["learning_rate"] == b["learning_rate"]
    for name, value in fitted.get_state().items():
        np.testing.assert_array_equal(partial.get_state()[name], value)


@pytest.mark.parametrize("kind", ["full", "fwbw"])
def test_partial_fit_over_chunks_learns(linear, kind):
    X, y, onx = linear
    est = _trainer(kind, onx, learning_rate=0.02, batch_size=16, random_state=0)
    start = None
    for epoch in range(3):
        for rows in np.array_split(np.arange(len(X)), 5):
            est.partial_fit(X[rows], y[rows])
            start = start if start is not None else est.train_losses_[0]
    assert est.train_losses_[-1] < 0.1 * start
    assert est.score(X, y) > 0.95
    with pytest.raises(ValueError, match="X has 4 features but the model expects 5"):
        est.partial_fit(X[:, :4], y)


def test_fit_starts_over_and_partial_fit_continues(linear):
    """As scikit-learn's SGD estimators: fit after partial_fit starts from the graph's weights; partial_fit after
    fit continues from the fitted ones (fit for 2 epochs + partial_fit once = fit for 3 epochs)."""
    X, y, onx = linear
    kw = dict(learning_rate=0.01, batch_size=32, shuffle=False)
    est = _trainer("fwbw", onx, max_iter=2, **kw)
    est.partial_fit(X, y)
    est.partial_fit(X, y)
    est.fit(X, y)
    assert len(est.history_) == 2
    fresh = _trainer("fwbw", onx, max_iter=2, **kw).fit(X, y)
    for name, value in fresh.get_state().items():
        np.testing.assert_array_equal(est.get_state()[name], value)
    est.partial_fit(X, y)
    three = _trainer("fwbw", onx, max_iter=3, **kw).fit(X, y)
    for name, value in three.get_state().items():
        np.testing.assert_array_equal(est.get_state()[name], value)
