"""PNG figures logged by the stages (matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def loss_curves(history: Sequence[Mapping], path: str | Path, title: str = "") -> Path:
    """Train (and validation) loss per epoch, log scale when the losses stay positive."""
    epochs = [r["epoch"] for r in history]
    train = [r.get("train_loss") for r in history]
    valid = [r.get("validation_loss") for r in history]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(epochs, train, marker=".", label="train")
    if any(v is not None for v in valid):
        ax.plot(epochs, [np.nan if v is None else v for v in valid], marker=".", label="validation")
    finite = [v for v in train + valid if v is not None and np.isfinite(v)]
    if finite and min(finite) > 0:
        ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.set_title(title or "loss")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(fig, path)


def predicted_vs_actual(y_true: np.ndarray, predictions: Mapping[str, np.ndarray], path: str | Path) -> Path:
    """Scatter of predictions against targets, one colour per model, with the identity line."""
    fig, ax = plt.subplots(figsize=(5, 5))
    for label, y_pred in predictions.items():
        ax.scatter(y_true, y_pred, s=8, alpha=0.6, label=label)
    low = float(min(np.min(y_true), *(np.min(p) for p in predictions.values())))
    high = float(max(np.max(y_true), *(np.max(p) for p in predictions.values())))
    ax.plot([low, high], [low, high], color="black", linewidth=1)
    ax.set_xlabel("actual")
    ax.set_ylabel("predicted")
    ax.set_title("predicted vs actual (test)")
    ax.legend()
    return _save(fig, path)


def roc_curves(y_true: np.ndarray, probabilities: Mapping[str, np.ndarray], path: str | Path) -> Path:
    """ROC curve of each model's probability of class 1."""
    from sklearn.metrics import roc_auc_score, roc_curve

    fig, ax = plt.subplots(figsize=(5, 5))
    for label, proba in probabilities.items():
        fpr, tpr, _ = roc_curve(y_true, proba)
        ax.plot(fpr, tpr, label=f"{label} (AUC {roc_auc_score(y_true, proba):.3f})")
    ax.plot([0, 1], [0, 1], color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title("ROC (test)")
    ax.legend(loc="lower right")
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
