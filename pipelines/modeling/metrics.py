"""Test metrics of a model: the same functions score the ONNX model and the scikit-learn baseline."""

from __future__ import annotations

import numpy as np


def regression_metrics(y_true: np.ndarray, y_pred: np.ndarray, prefix: str = "test_") -> dict[str, float]:
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    y_true, y_pred = np.asarray(y_true, dtype=np.float64), np.asarray(y_pred, dtype=np.float64)
    if not np.isfinite(y_pred).all():
        return {f"{prefix}mse": float("nan"), f"{prefix}mae": float("nan"), f"{prefix}r2": float("nan")}
    return {
        f"{prefix}mse": float(mean_squared_error(y_true, y_pred)),
        f"{prefix}mae": float(mean_absolute_error(y_true, y_pred)),
        f"{prefix}r2": float(r2_score(y_true, y_pred)),
    }


from ..base.metric_names import CLASSIFICATION, PER_CLASS, PREFIXES, REGRESSION, is_metric, metric_names  # noqa: F401


def classification_metrics(y_true: np.ndarray, proba: np.ndarray, classes: np.ndarray, prefix: str = "test_",
                           per_class: bool = False) -> dict[str, float]:
    """Accuracy, macro F1, log loss and ROC AUC (one-vs-rest, macro, for k > 2) of class probabilities.

    ``proba`` is (n, k), its columns in the order of ``classes``; predicted labels are ``classes[argmax]``. With
    ``per_class``, also ``<prefix>precision_<class>``, ``recall_<class>`` and ``f1_<class>`` for every class.
    """
    from sklearn.metrics import accuracy_score, f1_score, log_loss, precision_recall_fscore_support, roc_auc_score

    y_true, proba, classes = np.asarray(y_true), np.asarray(proba, dtype=np.float64), np.asarray(classes)
    if proba.ndim != 2 or proba.shape != (len(y_true), len(classes)):
        raise ValueError(f"probabilities of shape {proba.shape} for {len(y_true)} rows and {len(classes)} classes")
    names = ["accuracy", "f1_macro", "log_loss", "roc_auc"]
    if per_class:
        names += [f"{m}_{metric_suffix(c)}" for c in classes for m in ("precision", "recall", "f1")]
    if not np.isfinite(proba).all():
        return {f"{prefix}{n}": float("nan") for n in names}
    y_pred = classes[np.argmax(proba, axis=1)]
    metrics = {
        "accuracy": accuracy_score(y_true, y_pred),
        "f1_macro": f1_score(y_true, y_pred, labels=classes, average="macro", zero_division=0),
        "log_loss": log_loss(y_true, _rows_summing_to_one(proba), labels=classes),
        "roc_auc": _roc_auc(roc_auc_score, y_true, proba, classes),
    }
    if per_class:
        precision, recall, f1, _ = precision_recall_fscore_support(y_true, y_pred, labels=classes, zero_division=0)
        for c, p, r, f in zip(classes, precision, recall, f1):
            suffix = metric_suffix(c)
            metrics.update({f"precision_{suffix}": p, f"recall_{suffix}": r, f"f1_{suffix}": f})
    return {f"{prefix}{k}": float(v) for k, v in metrics.items()}


def _rows_summing_to_one(proba: np.ndarray) -> np.ndarray:
    """float32 probabilities sum to 1 within 1e-7, not within the 1.5e-8 scikit-learn's log_loss checks."""
    proba = np.clip(proba, 1e-15, 1.0)
    return proba / proba.sum(axis=1, keepdims=True)


def _roc_auc(roc_auc_score, y_true: np.ndarray, proba: np.ndarray, classes: np.ndarray) -> float:
    present = np.unique(y_true)
    if len(present) < 2:
        return float("nan")
    if len(classes) == 2:
        return roc_auc_score(y_true == classes[1], proba[:, 1])
    if len(present) < len(classes):  # a class absent from the test rows has no one-vs-rest curve
        return float("nan")
    return roc_auc_score(y_true, proba, multi_class="ovr", average="macro", labels=classes)


def metric_suffix(label) -> str:
    """``class_<label>`` with the characters MLflow refuses in metric names replaced by ``_``."""
    import re

    return "class_" + re.sub(r"[^0-9A-Za-z_\-. ]", "_", str(label))


class StreamedMetrics:
    """The metrics of :func:`regression_metrics` / :func:`classification_metrics` over predictions that arrive
    chunk by chunk (``data=parquet``'s test part). Regression keeps sufficient statistics only (rows, sums of the
    absolute and squared errors, the target's mean and sum of squared deviations, merged chunk by chunk as Chan et
    al. do): R² without the predictions. Classification keeps the labels and the float32 probabilities (ROC AUC
    ranks every row), then scores them once."""

    def __init__(self, task: str, classes: np.ndarray, prefix: str = "test_", per_class: bool = False):
        self.task, self.classes, self.prefix, self.per_class = task, np.asarray(classes), prefix, per_class
        self.n, self.sse, self.sae, self.mean, self.m2, self.finite = 0, 0.0, 0.0, 0.0, 0.0, True
        self.labels: list[np.ndarray] = []
        self.probabilities: list[np.ndarray] = []

    def update(self, y_true: np.ndarray, predicted: np.ndarray) -> None:
        if self.task == "classification":
            self.labels.append(np.asarray(y_true))
            self.probabilities.append(np.asarray(predicted, dtype=np.float32))
            return
        y, p = np.asarray(y_true, dtype=np.float64), np.asarray(predicted, dtype=np.float64)
        if not len(y):
            return
        self.finite = self.finite and bool(np.isfinite(p).all())
        error = y - p
        self.sse += float(error @ error)
        self.sae += float(np.abs(error).sum())
        n, mean = len(y), float(y.mean())
        m2 = float(((y - mean) ** 2).sum())
        delta, total = mean - self.mean, self.n + n
        self.m2 += m2 + delta * delta * self.n * n / total
        self.mean += delta * n / total
        self.n = total

    def result(self) -> dict[str, float]:
        if self.task == "classification":
            return classification_metrics(np.concatenate(self.labels), np.concatenate(self.probabilities),
                                          self.classes, self.prefix, per_class=self.per_class)
        if not self.finite:
            return regression_metrics([0.0], [float("nan")], self.prefix)
        r2 = 1.0 - self.sse / self.m2 if self.m2 > 0 else (1.0 if self.sse == 0 else 0.0)
        return {f"{self.prefix}mse": self.sse / self.n, f"{self.prefix}mae": self.sae / self.n,
                f"{self.prefix}r2": r2}
