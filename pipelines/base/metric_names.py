"""The names of the metrics ``evaluate`` writes, per task: what ``promotion.metric`` may name (checked before any
run, without the modeling layer)."""

from __future__ import annotations

REGRESSION = ("mse", "mae", "r2")
CLASSIFICATION = ("accuracy", "f1_macro", "log_loss", "roc_auc")
#: the per-class metrics of a classifier, one per class: ``test_<name>_class_<label>``
PER_CLASS = ("precision", "recall", "f1")
#: the trained model (``test_``), the scikit-learn reference fitted to convergence (``sklearn_test_``) and the start,
#: the under-trained scikit-learn fit training began from (``start_test_``); the trained model on the validation rows
#: (``validation_``: what models with different losses share, to choose among them)
PREFIXES = ("test_", "sklearn_test_", "start_test_", "validation_")
#: what ``train`` writes: each model's own loss (its estimator's, or ``loss=``), on the training and validation rows
LOSSES = ("validation_loss", "best_validation_loss", "train_loss", "final_train_loss")
#: the metrics where larger is better (promotion maximizes them); the others are errors, minimized
MAXIMIZED = ("r2", "accuracy", "f1_macro", "roc_auc", *PER_CLASS)
#: the metric promotion compares by default, per task
DEFAULT = {"regression": "test_mse", "classification": "test_log_loss"}


def shared_metric(task: str) -> str:
    """The metric of the validation rows that models with different losses share: ``validation_mse`` (regression),
    ``validation_log_loss`` (classification)."""
    return "validation_" + DEFAULT[task][len("test_"):]


def optimizable(task: str) -> list[str]:
    """What ``optimized_metric`` may name: the losses ``train`` writes and the metrics ``evaluate`` writes."""
    return [*LOSSES, *metric_names(task)]


def metric_names(task: str) -> list[str]:
    """The metric names ``evaluate`` writes for ``task`` (per-class ones as a pattern)."""
    base = REGRESSION if task == "regression" else CLASSIFICATION
    names = [f"{p}{m}" for p in PREFIXES for m in base]
    return names + ([f"test_{m}_class_<label>" for m in PER_CLASS] if task == "classification" else [])


def is_metric(name: str, task: str) -> bool:
    """Whether ``evaluate`` writes a metric ``name`` for ``task`` (a per-class one for any class label)."""
    if name in metric_names(task):
        return True
    return task == "classification" and any(name.startswith(f"test_{m}_class_") for m in PER_CLASS)


def direction(name: str) -> str:
    """``'maximize'`` for a metric of :data:`MAXIMIZED` (``test_r2``, ``sklearn_test_accuracy``,
    ``test_f1_class_3``...), else ``'minimize'``."""
    base = name.lower()
    for prefix in PREFIXES:
        if base.startswith(prefix):
            base = base[len(prefix):]
            break
    return "maximize" if base.split("_class_")[0] in MAXIMIZED else "minimize"
