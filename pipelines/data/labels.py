"""The class labels of a classification target, checked before any run is created (every data set: bundled,
generated or a table).

The labels stay as the data has them (integers from any start, strings): the scikit-learn model is fitted on
them, the ONNX graph carries them as its classes, the trainers map them through those classes and the
registered model answers with them. A target no classifier can learn from is a :class:`DataError` naming the
problem: one label, non-integral numbers or too many distinct values (a regression target), a class too small
for the stratified split.
"""

from __future__ import annotations

import numpy as np
from omegaconf import DictConfig

from ..base.errors import DataError

#: a class needs this many rows: one for the test split, one for training and one for validation
MIN_ROWS_PER_CLASS = 3
#: more distinct values than this are not labels
MAX_CLASSES = 100
_REGRESSION_HINT = "for a continuous target set data.task=regression (and a regression model and loss)"


def target_description(data: DictConfig) -> str:
    """How messages name the target: ``data.target='y' of table.csv`` or ``the target of data=iris``."""
    from ..base.schema import data_loader

    if data_loader(data) == "file":
        from .tables import table_path

        return f"data.target={data.target!r} of {table_path(data).name}"
    return f"the target of data={data.name}"


def class_labels(y: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``(classes, labels)``: the sorted classes and ``y`` as int64 (integral numbers) or str labels.

    ``where`` names the target in messages (``data.target='y' of table.csv``, ``the target of data=iris``).
    """
    y = np.asarray(y)
    if y.dtype.kind == "f":
        if not np.isfinite(y).all():
            raise DataError(f"{where} holds NaN or infinite values: not labels")
        fractional = y[y != np.round(y)]
        if len(fractional):
            raise DataError(f"{where} holds non-integral numbers ({fractional[:3].tolist()} ...): not labels; "
                            + _REGRESSION_HINT)
        y = y.astype(np.int64)
    elif y.dtype.kind in "iub":
        y = y.astype(np.int64)
    else:
        y = y.astype(str)
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2:
        raise DataError(f"{where} holds one label ({str(classes[0])!r}): a classifier needs at least two")
    if len(classes) > MAX_CLASSES:
        raise DataError(f"{where} holds {len(classes)} distinct values: not labels (at most {MAX_CLASSES} "
                        f"classes); {_REGRESSION_HINT}")
    small = [str(c) for c in classes[counts < MIN_ROWS_PER_CLASS]]
    if small:
        raise DataError(f"labels {small[:10]} of {where} have fewer than {MIN_ROWS_PER_CLASS} rows: every class "
                        "needs that many for the stratified train/validation/test split"
                        + (f" (a regression target? {_REGRESSION_HINT})" if len(small) > len(classes) // 2 else ""))
    return classes, y
