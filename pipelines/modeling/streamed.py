"""Test metrics of models over a streamed test part (``data=parquet``): each chunk read once, every model's
predictions scored as they come (:class:`pipelines.modeling.metrics.StreamedMetrics`), a bounded sample kept for
the plots."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..data.datasets import Split
from ..data.streams import labels_like, raw_rows
from .metrics import StreamedMetrics

#: the test rows whose predictions are kept for the plots
PLOT_ROWS = 5000
#: the metric prefix of each model's predictions: the trained graph, the converged reference, the start
PREFIX = {"onnx": "test_", "sklearn": "sklearn_test_", "start": "start_test_"}


@dataclass
class StreamedTest:
    """The metrics of each model, the test rows read, and the first rows' targets and predictions (plots)."""

    metrics: dict[str, float]
    n_rows: int
    y_sample: np.ndarray
    predictions_sample: dict[str, np.ndarray] = field(default_factory=dict)


def streamed_test(split: Split, predictors: Mapping[str, Callable[[np.ndarray], np.ndarray]],
                  per_class: tuple[str, ...] = (), keep_rows: int = PLOT_ROWS) -> StreamedTest:
    """Stream the test part of ``split`` once: ``predictors[label](X_raw)`` answers in the target's units (or class
    probabilities) for the raw features of a chunk (float64, or a table's columns: :func:`raw_rows`); metrics named
    with ``PREFIX[label]``."""
    classes = split.classes if split.task == "classification" else split.classes[:0]
    scores = {label: StreamedMetrics(split.task, split.classes, PREFIX[label], label in per_class)
              for label in predictors}
    kept_y, kept = [], {label: [] for label in predictors}
    n_rows = 0
    test = split.stream_parts()["test"]
    kinds = split.column_kinds()  # a table's (empty for numbers: standardized features)
    for X, y, _ in test.chunks(None):
        X, y = raw_rows(test, X, y, "test", kinds, split.junk_cells)
        y = labels_like(y, classes) if len(classes) else y.astype(np.float64)
        room = max(keep_rows - n_rows, 0)
        n_rows += len(y)
        if room:
            kept_y.append(y[:room])
        for label, predict in predictors.items():
            predicted = predict(X)
            scores[label].update(y, predicted)
            if room:
                kept[label].append(predicted[:room])
    if not n_rows:
        raise ValueError(f"the test part of {test.path} holds no rows")
    metrics = {k: v for score in scores.values() for k, v in score.result().items()}
    return StreamedTest(metrics, n_rows, np.concatenate(kept_y),
                        {label: np.concatenate(parts) for label, parts in kept.items()})
