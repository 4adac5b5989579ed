"""Predictions of an ONNX graph run by onnxruntime, and the check that none is NaN or infinite (evaluate and
export run both on the test split)."""

from __future__ import annotations

import numpy as np
import onnxruntime

from ..data.datasets import Split


def onnx_predict(session: onnxruntime.InferenceSession, X: np.ndarray, task: str) -> np.ndarray:
    """Regression predictions (n,) from the first output, or the class probabilities (n, k)."""
    feeds = {session.get_inputs()[0].name: X.astype(np.float32)}
    names = [o.name for o in session.get_outputs()]
    if task == "classification":
        return np.asarray(session.run(["output_probability"], feeds)[0])
    out = np.asarray(session.run([names[0]], feeds)[0])
    return out.reshape(len(X), -1)[:, 0]


class NonFinitePredictionError(ValueError):
    """The deployable model predicts NaN or infinity on test rows: it must not be registered."""


def check_finite_predictions(predictions: np.ndarray, split: Split) -> None:
    """Raise :class:`NonFinitePredictionError` naming the rows (and features whose float32 statistics overflow)."""
    predictions = np.asarray(predictions).reshape(len(predictions), -1)
    bad = np.flatnonzero(~np.isfinite(predictions).all(axis=1))
    if not len(bad):
        return
    stats = ~(np.isfinite(split.x_mean) & np.isfinite(split.x_scale))
    names = [str(n) for n in split.feature_names[stats]]
    cause = (f"; the float32 standardization of features {names} overflows (a value beyond float32's range, "
             "±3.4e38, in the data)" if names else "")
    raise NonFinitePredictionError(
        f"the deployable model predicts non-finite values on {len(bad)} of {len(predictions)} test rows (first at "
        f"row {bad[0]}: {predictions[bad[0]].tolist()}){cause}: it is not registered")
