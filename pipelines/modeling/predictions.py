"""Predictions of an ONNX graph run by onnxruntime, and the check that none is NaN or infinite (evaluate and
export run both on the test split)."""

from __future__ import annotations

import numpy as np
import onnxruntime

from ..data.datasets import Split


#: onnxruntime's type names of the inputs a table's graph has, as ONNX element types
_ELEMENT_TYPES = {"tensor(float)": 1, "tensor(int64)": 7, "tensor(string)": 8, "tensor(double)": 11}


def session_feeds(session: onnxruntime.InferenceSession, X) -> dict[str, np.ndarray]:
    """The feeds of ``session`` for ``X``: a float matrix for one input, or a table's columns (a DataFrame) fed by
    name as :class:`ortflow.data.inputs.InputMapping` feeds them (dates as days since 1970-01-01, gaps where imputed)."""
    if isinstance(X, np.ndarray):  # int64 token ids stay integers; everything else computes in float32
        spec = session.get_inputs()[0]
        return {spec.name: X.astype(np.int64 if spec.type == "tensor(int64)" else np.float32)}
    from ortflow.data.inputs import DataInput, InputMapping

    inputs = [DataInput(i.name, _ELEMENT_TYPES[i.type], tuple(i.shape[1:])) for i in session.get_inputs()]
    return InputMapping(inputs, allow_missing=True).feeds(X)[0]


def onnx_predict(session: onnxruntime.InferenceSession, X: np.ndarray, task: str) -> np.ndarray:
    """Regression predictions (n,) from the first output, or the class probabilities (n, k)."""
    feeds = session_feeds(session, X)
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
    names = [str(n) for n in split.feature_names[stats]] if len(stats) == len(split.feature_names) else []
    cause = (f"; the float32 standardization of features {names} overflows (a value beyond float32's range, "
             "±3.4e38, in the data)" if names else "")
    raise NonFinitePredictionError(
        f"the deployable model predicts non-finite values on {len(bad)} of {len(predictions)} test rows (first at "
        f"row {bad[0]}: {predictions[bad[0]].tolist()}){cause}: it is not registered")
