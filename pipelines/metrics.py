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


def classification_metrics(y_true: np.ndarray, proba: np.ndarray, prefix: str = "test_") -> dict[str, float]:
    """``proba``: probability of class 1; labels are ``proba >= 0.5``."""
    from sklearn.metrics import accuracy_score, log_loss, roc_auc_score

    y_true, proba = np.asarray(y_true).astype(np.int64), np.asarray(proba, dtype=np.float64)
    if not np.isfinite(proba).all():
        return {f"{prefix}accuracy": float("nan"), f"{prefix}log_loss": float("nan"), f"{prefix}roc_auc": float("nan")}
    return {
        f"{prefix}accuracy": float(accuracy_score(y_true, (proba >= 0.5).astype(np.int64))),
        f"{prefix}log_loss": float(log_loss(y_true, np.clip(proba, 1e-15, 1 - 1e-15), labels=[0, 1])),
        f"{prefix}roc_auc": float(roc_auc_score(y_true, proba)) if len(np.unique(y_true)) == 2 else float("nan"),
    }
