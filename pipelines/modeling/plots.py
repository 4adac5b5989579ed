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


def roc_curves(y_true: np.ndarray, probabilities: Mapping[str, np.ndarray], classes: np.ndarray,
               path: str | Path) -> Path:
    """ROC curves: for two classes, each model's curve of ``classes[1]``; for more, one-vs-rest curves of every
    class for the first model (the others' macro AUC in the legend). ``probabilities``: (n, k) per model."""
    from sklearn.metrics import roc_auc_score, roc_curve

    fig, ax = plt.subplots(figsize=(5, 5))
    if len(classes) == 2:
        for label, proba in probabilities.items():
            positive = np.asarray(y_true) == classes[1]
            fpr, tpr, _ = roc_curve(positive, proba[:, 1])
            ax.plot(fpr, tpr, label=f"{label} (AUC {roc_auc_score(positive, proba[:, 1]):.3f})")
        title = "ROC (test)"
    else:
        (first, proba), *others = probabilities.items()
        for column, cls in enumerate(classes):
            positive = np.asarray(y_true) == cls
            fpr, tpr, _ = roc_curve(positive, proba[:, column])
            ax.plot(fpr, tpr, linewidth=1, label=f"{cls} (AUC {roc_auc_score(positive, proba[:, column]):.3f})")
        for label, other in others:
            auc = roc_auc_score(y_true, other, multi_class="ovr", labels=classes)
            ax.plot([], [], " ", label=f"{label}: macro AUC {auc:.3f}")
        title = f"ROC one-vs-rest, {first} (test)"
    ax.plot([0, 1], [0, 1], color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize="small")
    return _save(fig, path)


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, classes: np.ndarray, path: str | Path) -> Path:
    """Counts of (true class, predicted class) on the test rows, the count written in each cell."""
    from sklearn.metrics import confusion_matrix as counts_of

    counts = counts_of(y_true, y_pred, labels=classes)
    size = max(4.0, 0.5 * len(classes) + 2)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(counts, cmap="Blues")
    ticks = np.arange(len(classes))
    ax.set_xticks(ticks, [str(c) for c in classes], rotation=90 if len(classes) > 6 else 0)
    ax.set_yticks(ticks, [str(c) for c in classes])
    threshold = counts.max() / 2 if counts.size else 0
    for (row, column), value in np.ndenumerate(counts):
        ax.text(column, row, str(value), ha="center", va="center", fontsize="small",
                color="white" if value > threshold else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title("confusion matrix (test)")
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
