"""Test metrics of a model: the same functions score the ONNX model and the scikit-learn baseline."""

from __future__ import annotations

import numpy as np

from ..base.metric_names import CLASSIFICATION, PER_CLASS


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
    names = list(CLASSIFICATION)
    if per_class:
        names += [f"{m}_{metric_suffix(c)}" for c in classes for m in PER_CLASS]
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
    chunk by chunk (``data=parquet``'s test part), in bounded memory. Regression keeps sufficient statistics only
    (rows, sums of the absolute and squared errors, the target's mean and sum of squared deviations, merged chunk by
    chunk as Chan et al. do): R² without the predictions. Classification keeps the labels and the float32
    probabilities of the first ``exact_rows`` rows and scores them with :func:`classification_metrics`; past them it
    folds every row into a :class:`ClassificationTally` (counts, summed log loss, histograms of the scores)."""

    def __init__(self, task: str, classes: np.ndarray, prefix: str = "test_", per_class: bool = False,
                 exact_rows: int = 1 << 20):
        self.task, self.classes, self.prefix, self.per_class = task, np.asarray(classes), prefix, per_class
        self.n, self.sse, self.sae, self.mean, self.m2, self.finite = 0, 0.0, 0.0, 0.0, 0.0, True
        self.exact_rows, self.held = int(exact_rows), 0
        self.labels: list[np.ndarray] = []
        self.probabilities: list[np.ndarray] = []
        self.tally: ClassificationTally | None = None

    def update(self, y_true: np.ndarray, predicted: np.ndarray) -> None:
        if self.task == "classification":
            y, proba = np.asarray(y_true), np.asarray(predicted, dtype=np.float32)
            if self.tally is None and self.held + len(y) <= self.exact_rows:
                self.labels.append(y)
                self.probabilities.append(proba)
                self.held += len(y)
                return
            if self.tally is None:  # past exact_rows: the rows held go into the tally, and every row after them
                self.tally = ClassificationTally(self.classes)
                for held_y, held_proba in zip(self.labels, self.probabilities):
                    self.tally.update(held_y, held_proba)
                self.labels, self.probabilities = [], []
            self.tally.update(y, proba)
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
            if self.tally is not None:
                return self.tally.result(self.prefix, self.per_class)
            return classification_metrics(np.concatenate(self.labels), np.concatenate(self.probabilities),
                                          self.classes, self.prefix, per_class=self.per_class)
        if not self.finite:
            return regression_metrics([0.0], [float("nan")], self.prefix)
        r2 = 1.0 - self.sse / self.m2 if self.m2 > 0 else (1.0 if self.sse == 0 else 0.0)
        return {f"{self.prefix}mse": self.sse / self.n, f"{self.prefix}mae": self.sae / self.n,
                f"{self.prefix}r2": r2}


_ONE_BITS = int(np.float32(1.0).view(np.uint32))  # the bit pattern of 1.0: [0, 1]'s float32 values lie below it


class ClassificationTally:
    """What :func:`classification_metrics` computes, in memory that does not grow with the rows: per class the
    rows predicted, the rows labelled and the rows both (accuracy, macro F1, precision, recall), the summed log
    loss, and for each ROC curve (class 1's for two classes, each class against the rest for more) histograms of
    the float32 scores of its positive and negative rows. A histogram bin holds the scores sharing their float32
    bit pattern but its last ``shift`` bits (:attr:`shift`: 10 for two classes, one more per doubling of the
    curves): scores that close (relatively 2^-(23 - shift)) count as ties, half a pair each, as equal scores do in
    scikit-learn's ``roc_auc_score``. The AUC is off by at most half the share of positive-negative pairs that
    share a bin (:meth:`auc_bound`); the other metrics are exact but for the order of their sums."""

    def __init__(self, classes: np.ndarray):
        self.classes = np.asarray(classes)
        k = len(self.classes)
        self.curves = [1] if k == 2 else list(range(k))
        self.shift = 10 + int(np.ceil(np.log2(len(self.curves))))  # about 2^20 bins for all the curves together
        self._order = np.argsort(self.classes)  # a label's class index by binary search
        bins = (_ONE_BITS >> self.shift) + 1
        self.positive = np.zeros((len(self.curves), bins), dtype=np.int64)
        self.negative = np.zeros_like(self.positive)
        self.predicted, self.labelled, self.correct = (np.zeros(k, dtype=np.int64) for _ in range(3))
        self.n, self.log_loss, self.finite = 0, 0.0, True

    def update(self, y_true: np.ndarray, proba: np.ndarray) -> None:
        y_true, proba = np.asarray(y_true), np.asarray(proba, dtype=np.float32)
        k = len(self.classes)
        if proba.ndim != 2 or proba.shape != (len(y_true), k):
            raise ValueError(f"probabilities of shape {proba.shape} for {len(y_true)} rows and {k} classes")
        if not len(y_true):
            return
        if not np.isfinite(proba).all():
            self.finite = False
            return
        found = np.searchsorted(self.classes, y_true, sorter=self._order)
        truth = self._order[np.minimum(found, k - 1)]
        unknown = self.classes[truth] != y_true
        if unknown.any():
            raise ValueError(f"label {y_true[unknown][0].item()!r} is not among the classes {self.classes.tolist()}")
        guess = np.argmax(proba, axis=1)
        self.n += len(y_true)
        self.predicted += np.bincount(guess, minlength=k)
        self.labelled += np.bincount(truth, minlength=k)
        self.correct += np.bincount(truth[guess == truth], minlength=k)
        eps = np.finfo(np.float64).eps
        normalized = _rows_summing_to_one(proba.astype(np.float64))
        self.log_loss -= float(np.log(np.clip(normalized[np.arange(len(truth)), truth], eps, 1 - eps)).sum())
        bins = self.positive.shape[1]
        for curve, c in enumerate(self.curves):
            scores = (np.clip(proba[:, c], 0.0, 1.0) + np.float32(0.0)).view(np.uint32) >> self.shift  # no -0.0
            positive = truth == c
            self.positive[curve] += np.bincount(scores[positive], minlength=bins)
            self.negative[curve] += np.bincount(scores[~positive], minlength=bins)

    def _auc(self, curve: int) -> float:
        positive, negative = self.positive[curve].astype(np.float64), self.negative[curve].astype(np.float64)
        below = np.cumsum(negative) - negative  # the negative rows scored in lower bins
        return float((positive * (below + 0.5 * negative)).sum() / (positive.sum() * negative.sum()))

    def auc_bound(self) -> float:
        """The largest error of the (macro) ROC AUC: half the share of positive-negative pairs in one bin."""
        shares = [float((self.positive[c].astype(np.float64) * self.negative[c]).sum()
                        / (self.positive[c].sum() * self.negative[c].sum())) for c in range(len(self.curves))]
        return 0.5 * max(shares)

    def result(self, prefix: str = "test_", per_class: bool = False) -> dict[str, float]:
        names = list(CLASSIFICATION)
        if per_class:
            names += [f"{m}_{metric_suffix(c)}" for c in self.classes for m in PER_CLASS]
        if not self.finite or not self.n:
            return {f"{prefix}{n}": float("nan") for n in names}
        precision = np.divide(self.correct, self.predicted, out=np.zeros(len(self.classes)),
                              where=self.predicted > 0)
        recall = np.divide(self.correct, self.labelled, out=np.zeros(len(self.classes)), where=self.labelled > 0)
        f1 = np.divide(2 * self.correct, self.predicted + self.labelled, out=np.zeros(len(self.classes)),
                       where=self.predicted + self.labelled > 0)
        present = int((self.labelled > 0).sum())
        auc = (float("nan") if present < 2 or (len(self.classes) > 2 and present < len(self.classes))
               else float(np.mean([self._auc(c) for c in range(len(self.curves))])))
        metrics = {"accuracy": self.correct.sum() / self.n, "f1_macro": f1.mean(), "log_loss": self.log_loss / self.n,
                   "roc_auc": auc}
        if per_class:
            for c, p, r, f in zip(self.classes, precision, recall, f1):
                suffix = metric_suffix(c)
                metrics.update({f"precision_{suffix}": p, f"recall_{suffix}": r, f"f1_{suffix}": f})
        return {f"{prefix}{k}": float(v) for k, v in metrics.items()}
