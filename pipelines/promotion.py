"""Alias-based promotion: a new model version takes the alias only when its metric beats the current holder's.

Registry stages are deprecated in MLflow; the alias (``champion`` by default) is what serving code loads
(``models:/<name>@champion``). The decision, the metric, both values and the previous holder are written as tags
on the new version and on the run, so the registry tells why each version does or does not hold the alias.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from mlflow.exceptions import MlflowException

from .tracking import Tracking, is_finite, set_tags

MAXIMIZED = ("r2", "accuracy", "roc_auc", "auc", "f1", "precision", "recall")
TAG = "ortflow.promotion."
FINGERPRINT_TAG = "ortflow.data_fingerprint"


@dataclass
class Decision:
    promoted: bool
    decision: str  # promoted | kept | rejected
    reason: str
    metric: str
    direction: str
    alias: str
    candidate_value: float | None
    holder_version: str | None = None
    holder_value: float | None = None

    def tags(self) -> dict[str, str]:
        return {f"{TAG}{k}": ("" if v is None else str(v)) for k, v in asdict(self).items()}


def default_metric(task: str) -> str:
    return "test_log_loss" if task == "classification" else "test_mse"


def default_direction(metric: str) -> str:
    name = metric.lower()
    return "maximize" if any(name.endswith(m) for m in MAXIMIZED) else "minimize"


def better(candidate: float, holder: float, direction: str) -> bool:
    """Strictly better: a tie keeps the current holder."""
    return candidate > holder if direction == "maximize" else candidate < holder


def holder_value(tracking: Tracking, name: str, version, metric: str) -> float | None:
    """The metric of the version holding the alias: its tag when it has one, else its run's metric."""
    tag = version.tags.get(f"{TAG}candidate_value") if version.tags.get(f"{TAG}metric") == metric else None
    if is_finite(tag):
        return float(tag)
    if version.run_id:
        with contextlib.suppress(MlflowException):
            value = tracking.client.get_run(version.run_id).data.metrics.get(metric)
            if is_finite(value):
                return float(value)
    return None


def current_holder(tracking: Tracking, name: str, alias: str):
    try:
        return tracking.client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(exc.error_code) or "not found" in str(exc).lower():
            return None
        raise


def promote(tracking: Tracking, name: str, version: str | None, run_id: str, value: float | None, metric: str,
            direction: str, alias: str, run_failed: bool = False, fingerprint: str | None = None,
            require_same_data: bool = True) -> Decision:
    """Decide, move the alias when the candidate wins, and record the decision as tags (version and run).

    ``fingerprint`` identifies the test set the metric was measured on; with ``require_same_data`` a candidate
    measured on other data than the holder's never takes the alias (the two numbers are not comparable).
    """
    with _registry_lock(tracking):
        holder = current_holder(tracking, name, alias)
        h_version = str(holder.version) if holder is not None else None
        h_value = holder_value(tracking, name, holder, metric) if holder is not None else None
        h_fingerprint = holder.tags.get(FINGERPRINT_TAG) if holder is not None else None
        common = dict(metric=metric, direction=direction, alias=alias,
                      candidate_value=float(value) if is_finite(value) else None,
                      holder_version=h_version, holder_value=h_value)
        if run_failed or version is None:
            decision = Decision(False, "rejected", "the run failed", **common)
        elif not is_finite(value):
            decision = Decision(False, "rejected", f"{metric}={value} is not a finite number", **common)
        elif holder is None:
            decision = Decision(True, "promoted", f"no version holds @{alias} yet", **common)
        elif require_same_data and fingerprint and h_fingerprint and fingerprint != h_fingerprint:
            decision = Decision(False, "kept", f"measured on other test data than version {h_version} "
                                f"(fingerprint {fingerprint} vs {h_fingerprint}): not comparable; register under "
                                "another mlflow.registered_model_name or set promotion.require_same_data=false",
                                **common)
        elif h_value is None:
            decision = Decision(True, "promoted", f"the holder (version {h_version}) has no finite {metric}", **common)
        elif better(float(value), h_value, direction):
            decision = Decision(True, "promoted", f"{metric} {value:.6g} beats {h_value:.6g} ({direction})", **common)
        else:
            decision = Decision(False, "kept", f"{metric} {value:.6g} does not beat {h_value:.6g} ({direction})",
                                **common)
        if decision.promoted:
            tracking.client.set_registered_model_alias(name, alias, version)
    if version is not None:
        for key, text in decision.tags().items():
            tracking.client.set_model_version_tag(name, version, key, text)
    set_tags(tracking, run_id, decision.tags())
    return decision


@contextlib.contextmanager
def _registry_lock(tracking: Tracking) -> Iterator[None]:
    """With a local sqlite store, parallel jobs promote one at a time (a file lock next to the database)."""
    if not tracking.is_local_sqlite or os.name != "posix":
        yield
        return
    import fcntl

    db = Path(tracking.uri.split("sqlite:///", 1)[-1].split("?", 1)[0])
    lock = db.parent / ".ortflow" / "promotion.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
