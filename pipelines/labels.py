"""The class labels of a classification target, checked before any run is created.

The labels stay as the data has them (integers from any start, strings): the scikit-learn model is fitted on
them, the ONNX graph carries them as its classes, the trainers map them through those classes and the
registered model answers with them. A target no classifier can learn from is refused here, naming the problem:
one class, a continuous (regression) target, a class too small for the stratified split.
"""

from __future__ import annotations

import numpy as np

from .config import ConfigError

#: a class needs this many rows: one for the test split, one for training (and one for validation when asked)
MIN_ROWS_PER_CLASS = 3


def class_labels(y: np.ndarray, data_name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(classes, labels)``: the sorted classes and ``y`` as int64 (integral numbers) or str labels.

    Raises :class:`ConfigError` for a target with one class, non-integral numbers (a regression target), or a
    class with fewer than :data:`MIN_ROWS_PER_CLASS` rows.
    """
    y = np.asarray(y)
    where = f"data={data_name} with data.task=classification"
    if y.dtype.kind == "f":
        if not np.isfinite(y).all():
            raise ConfigError(f"{where}: the target holds NaN or infinite values")
        fractional = y[y != np.round(y)]
        if len(fractional):
            raise ConfigError(f"{where}: the target holds non-integral numbers ({fractional[:3].tolist()} ...), "
                              "a regression target: use data.task=regression with a regression model and loss")
        y = y.astype(np.int64)
    elif y.dtype.kind in "iub":
        y = y.astype(np.int64)
    else:
        y = y.astype(str)
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2:
        raise ConfigError(f"{where}: the target holds one class ({classes.tolist()}); a classifier needs at least two")
    small = classes[counts < MIN_ROWS_PER_CLASS]
    if len(small):
        hint = (" (many distinct values: a regression target? use data.task=regression)"
                if len(classes) > max(20, len(y) // 10) else "")
        raise ConfigError(f"{where}: {len(small)} of {len(classes)} classes have fewer than {MIN_ROWS_PER_CLASS} "
                          f"rows ({small[:5].tolist()} ...), too few to split into train and test{hint}")
    return classes, y
