"""Alias-based promotion: a new model version takes the alias only when its metric beats the current holder's.

Registry stages are deprecated in MLflow; the alias (``champion`` by default) is what serving code loads
(``models:/<name>@champion``). The decision, the metric, both values and the previous holder are written as tags
on the new version and on the run, so the registry tells why each version does or does not hold the alias.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from ..base import metric_names
from ..base.interrupts import deferred, pause_point
from .locks import file_lock, lock_path, sqlite_path
from .records import is_finite, log_metrics, set_tags
from .runs import hold_version
from .store import Tracking

TAG = "ortflow.promotion."
FINGERPRINT_TAG = "ortflow.data_fingerprint"
SETTLE_ROUNDS = 5
#: how much a challenger must beat the holder by (``promotion.min_relative_improvement`` and
#: ``promotion.min_absolute_improvement``): more than the larger of this share of the holder's value and this amount
MIN_RELATIVE_IMPROVEMENT = 1e-3
MIN_ABSOLUTE_IMPROVEMENT = 1e-6


@dataclass(frozen=True)
class Margin:
    """How much a challenger must improve on the holder: more than ``max(absolute, relative * |holder|)``."""

    relative: float = MIN_RELATIVE_IMPROVEMENT
    absolute: float = MIN_ABSOLUTE_IMPROVEMENT

    def required(self, holder: float) -> float:
        return max(self.absolute, self.relative * abs(holder))

    def describe(self, holder: float) -> str:
        return (f"needs more than {self.required(holder):.3g}: promotion.min_relative_improvement={self.relative:g} "
                f"of {holder:.6g}, promotion.min_absolute_improvement={self.absolute:g}")


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


CANDIDATE_TAG = "ortflow.candidate."


@dataclass
class Candidate:
    """A logged model that may become a registry version: what :func:`register` needs, kept as tags on its run
    (``ortflow.candidate.*``) so that a sweep can register its best trial after every trial has ended."""

    name: str  # the registered model
    model_uri: str
    run_id: str
    metric: str
    direction: str
    value: float | None
    alias: str
    fingerprint: str | None = None
    require_same_data: bool = True
    promote: bool = True
    policy: str = "always"  # promotion.register: always | if_promoted | best_of_sweep
    min_relative_improvement: float = MIN_RELATIVE_IMPROVEMENT
    min_absolute_improvement: float = MIN_ABSOLUTE_IMPROVEMENT

    @property
    def margin(self) -> Margin:
        return Margin(self.min_relative_improvement, self.min_absolute_improvement)

    def tags(self) -> dict[str, str]:
        return {f"{CANDIDATE_TAG}{k}": str(v) for k, v in asdict(self).items()
                if k not in ("run_id", "value") and v is not None}

    @classmethod
    def from_run(cls, run) -> "Candidate | None":
        """The candidate a run's tags describe, its value from the run's metrics; None when it describes none."""
        tags = {k[len(CANDIDATE_TAG):]: v for k, v in run.data.tags.items() if k.startswith(CANDIDATE_TAG)}
        if "model_uri" not in tags:
            return None
        return cls(tags["name"], tags["model_uri"], run.info.run_id, tags["metric"], tags["direction"],
                   run.data.metrics.get(tags["metric"]), tags["alias"], tags.get("fingerprint"),
                   tags.get("require_same_data", "True") == "True", tags.get("promote", "True") == "True",
                   tags.get("policy", "always"),
                   float(tags.get("min_relative_improvement", MIN_RELATIVE_IMPROVEMENT)),
                   float(tags.get("min_absolute_improvement", MIN_ABSOLUTE_IMPROVEMENT)))


def register(tracking: Tracking, candidate: Candidate, sweep: bool = False) -> tuple[str | None, Decision | None]:
    """Register the candidate's model as a new version and (when ``candidate.promote``) pass it through the gate.

    ``candidate.policy`` (``promotion.register``) says which candidates become versions: ``always``;
    ``if_promoted``, only one that would take the alias now (the gate is previewed against the holder first);
    ``best_of_sweep``, only a sweep's best trial (``sweep``). A non-finite metric registers nothing (the decision
    says why). Returns ``(version, decision)``; the run gets ``ortflow.registered`` (why not, when not),
    ``ortflow.registered_model``/``ortflow.registered_version``, the decision tags and the metric ``promoted``.
    """
    import mlflow

    c = candidate
    if c.policy == "best_of_sweep" and not sweep:
        set_tags(tracking, c.run_id, {"ortflow.registered": "false (promotion.register=best_of_sweep: only a "
                                      "sweep's best trial is registered)"})
        return None, None
    if c.policy == "if_promoted" and is_finite(c.value):
        if not c.promote:
            set_tags(tracking, c.run_id, {"ortflow.registered": "false (promotion.register=if_promoted and "
                                          "promotion.enabled=false: nothing takes the alias; "
                                          "promotion.register=always registers every model)"})
            return None, None
        would = preview(tracking, c)
        if not would.promoted:
            set_tags(tracking, c.run_id, {**would.tags(), "ortflow.registered": "false (promotion.register="
                                          f"if_promoted: {would.reason})"})
            log_metrics(tracking, c.run_id, {"promoted": 0.0})
            return None, would
    if not is_finite(c.value):
        decision = promote(tracking, c.name, None, c.run_id, c.value, c.metric, c.direction, c.alias)
        set_tags(tracking, c.run_id, {"ortflow.registered": "false (non-finite metric)"})
        log_metrics(tracking, c.run_id, {"promoted": 0.0})
        return None, decision
    # MLflow prints "Successfully registered model ..." and "Created version ...": the stage's summary says which
    # version was registered, and why; the version is deleted if the run does not finish (runs.hold_version)
    with _quiet_mlflow(), deferred():
        version = str(tracking.call(mlflow.register_model, c.model_uri, c.name,
                                    tags={"ortflow.run_id": c.run_id, f"ortflow.metric.{c.metric}": str(c.value),
                                          **({FINGERPRINT_TAG: c.fingerprint} if c.fingerprint else {})}).version)
        hold_version(c.run_id, c.name, version)
    pause_point("after_register")
    set_tags(tracking, c.run_id, {"ortflow.registered_model": c.name, "ortflow.registered_version": version,
                                  "ortflow.registered": "true"})
    if not c.promote:
        return version, None
    decision = promote(tracking, c.name, version, c.run_id, c.value, c.metric, c.direction, c.alias,
                       fingerprint=c.fingerprint, require_same_data=c.require_same_data, margin=c.margin)
    if decision.promoted:
        hold_version(c.run_id, c.name, version, {c.alias: decision.holder_version})
    log_metrics(tracking, c.run_id, {"promoted": float(decision.promoted)})
    return version, decision


@contextlib.contextmanager
def _quiet_mlflow():
    """MLflow's event output (``eprint`` and its loggers' stream) off for the block, as it was after."""
    from mlflow.utils import logging_utils

    was = logging_utils.MLFLOW_LOGGING_STREAM.enabled
    logging_utils.disable_logging()
    try:
        yield
    finally:
        if was:
            logging_utils.enable_logging()


def default_metric(task: str) -> str:
    return metric_names.DEFAULT[task]


def default_direction(metric: str) -> str:
    return metric_names.direction(metric)


def better(candidate: float, holder: float, direction: str, margin: Margin | None = None) -> bool:
    """Strictly better: a tie keeps the current holder; with ``margin``, better by more than it requires (a
    difference within float noise keeps the holder too)."""
    gain = candidate - holder if direction == "maximize" else holder - candidate
    return gain > (margin.required(holder) if margin is not None else 0.0)


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


def decide(value: float | None, direction: str, holder: ModelVersion | None, h_value: float | None,
           fingerprint: str | None, require_same_data: bool, common: dict, failed: bool = False,
           margin: Margin = Margin()) -> Decision:
    """The gate's rule, without side effects: does a candidate with ``value`` take the alias from ``holder``
    (whose metric is ``h_value``), beating it by more than ``margin`` requires? ``common``: the
    :class:`Decision` fields that do not depend on the outcome."""
    metric = common["metric"]
    h_version = common["holder_version"]
    h_fingerprint = holder.tags.get(FINGERPRINT_TAG) if holder is not None else None
    if failed:
        return Decision(False, "rejected", "the run failed", **common)
    if not is_finite(value):
        return Decision(False, "rejected", f"{metric}={value} is not a finite number", **common)
    if holder is None:
        return Decision(True, "promoted", f"no version holds @{common['alias']} yet", **common)
    if require_same_data and fingerprint and h_fingerprint and fingerprint != h_fingerprint:
        return Decision(False, "kept", f"measured on other test data than version {h_version} "
                        f"(fingerprint {fingerprint} vs {h_fingerprint}): not comparable; register under "
                        "another mlflow.registered_model_name or set promotion.require_same_data=false", **common)
    if h_value is None:
        return Decision(True, "promoted", f"the holder (version {h_version}) has no finite {metric}", **common)
    gain = abs(float(value) - h_value)
    if better(float(value), h_value, direction, margin):
        return Decision(True, "promoted", f"{metric} {value:.6g} beats {h_value:.6g} by {gain:.3g} ({direction}; "
                        f"{margin.describe(h_value)})", **common)
    if better(float(value), h_value, direction):
        return Decision(False, "kept", f"{metric} {value:.6g} beats {h_value:.6g} by only {gain:.3g} ({direction}; "
                        f"{margin.describe(h_value)})", **common)
    return Decision(False, "kept", f"{metric} {value:.6g} does not beat {h_value:.6g} ({direction})", **common)


def preview(tracking: Tracking, c: "Candidate") -> Decision:
    """What the gate would decide for ``c`` now, against the current holder (nothing written)."""
    holder = current_holder(tracking, c.name, c.alias)
    h_value = holder_value(tracking, c.name, holder, c.metric) if holder is not None else None
    common = dict(metric=c.metric, direction=c.direction, alias=c.alias,
                  candidate_value=float(c.value) if is_finite(c.value) else None,
                  holder_version=str(holder.version) if holder is not None else None, holder_value=h_value)
    return decide(c.value, c.direction, holder, h_value, c.fingerprint, c.require_same_data, common,
                  margin=c.margin)


def promote(tracking: Tracking, name: str, version: str | None, run_id: str, value: float | None, metric: str,
            direction: str, alias: str, run_failed: bool = False, fingerprint: str | None = None,
            require_same_data: bool = True, margin: Margin = Margin()) -> Decision:
    """Decide, move the alias when the candidate wins, settle races, record the decision as tags (version and run).

    ``fingerprint`` identifies the test set the metric was measured on; with ``require_same_data`` a candidate
    measured on other data than the holder's never takes the alias (the two numbers are not comparable).
    A candidate that can win first tags its version with its metric, value and fingerprint, so that promoters
    running at the same time see it; after deciding, :func:`settle` puts the alias on the best tagged version.
    ``margin``: how much the candidate must beat the holder by (:class:`Margin`).
    """
    eligible = not run_failed and version is not None and is_finite(value)
    if eligible:
        comparable = {f"{TAG}metric": metric, f"{TAG}candidate_value": str(float(value))}
        if fingerprint:
            comparable[FINGERPRINT_TAG] = fingerprint
        for key, text in comparable.items():
            tracking.client.set_model_version_tag(name, version, key, text)
    with _registry_lock(tracking):
        holder = current_holder(tracking, name, alias)
        h_version = str(holder.version) if holder is not None else None
        h_value = holder_value(tracking, name, holder, metric) if holder is not None else None
        common = dict(metric=metric, direction=direction, alias=alias,
                      candidate_value=float(value) if is_finite(value) else None,
                      holder_version=h_version, holder_value=h_value)
        decision = decide(value, direction, holder, h_value, fingerprint, require_same_data, common,
                          failed=run_failed or version is None, margin=margin)
        if decision.promoted:
            _set_alias(tracking, name, alias, version)
    if eligible:
        final = settle(tracking, name, alias, metric, direction, require_same_data, margin=margin)
        if decision.promoted and final is not None and str(final.version) != version:
            f_value = holder_value(tracking, name, final, metric)
            score = f" with {metric} {f_value:.6g}" if f_value is not None else ""
            decision = Decision(False, "kept", f"version {final.version}{score} took @{alias} in a concurrent "
                                "promotion", metric, direction, alias, decision.candidate_value, str(final.version),
                                f_value)
    if version is not None:
        for key, text in decision.tags().items():
            tracking.client.set_model_version_tag(name, version, key, text)
    set_tags(tracking, run_id, decision.tags())
    return decision


def settle(tracking: Tracking, name: str, alias: str, metric: str, direction: str, require_same_data: bool = True,
           max_rounds: int = SETTLE_ROUNDS, margin: Margin = Margin()) -> ModelVersion | None:
    """Move the alias to the best version comparable with its holder until a read finds nothing to move.

    Each round (after a short jittered pause, which only lets racing writes land first) reads the holder, then
    the versions. The target depends only on what the store holds, so every promoter computes the same one: the
    holder unless a version beats it by more than ``margin`` requires, the best of those, among those tagged with ``metric`` and a finite value, whose
    decision is not ``rejected`` and (with ``require_same_data``) whose fingerprint does not differ from the
    holder's. Why the alias ends on the best version: every eligible candidate tags itself before deciding, then
    settles, and a promoter stops only after a read that found nothing to move, made after its own last write.
    The globally last such read thus comes after the last alias write and after every candidate's tags: it saw
    the final holder and all candidates, and found no better version, or its promoter would have written again.
    ``max_rounds`` only bounds promoters that disagree (another metric or direction on the same alias).
    Returns the holder after the last round (None when no version holds the alias).
    """
    for _ in range(max_rounds):
        time.sleep(random.uniform(0.05, 0.15))
        holder = current_holder(tracking, name, alias)
        if holder is None:
            return None
        best = _best(tracking, name, holder, metric, direction, require_same_data, margin)
        if best == str(holder.version):
            return holder
        _set_alias(tracking, name, alias, best)
    return current_holder(tracking, name, alias)


def _best(tracking: Tracking, name: str, holder: ModelVersion, metric: str, direction: str,
          require_same_data: bool, margin: Margin = Margin()) -> str:
    """The version the alias belongs on: the holder, or the best eligible version that beats it by more than
    ``margin`` requires."""
    best, best_value = str(holder.version), holder_value(tracking, name, holder, metric)
    h_value = best_value
    h_fingerprint = holder.tags.get(FINGERPRINT_TAG)
    for mv in sorted(tracking.client.search_model_versions(f"name='{name}'"), key=lambda mv: int(mv.version)):
        tags = mv.tags
        value, fingerprint = tags.get(f"{TAG}candidate_value"), tags.get(FINGERPRINT_TAG)
        if (tags.get(f"{TAG}metric") != metric or not is_finite(value) or tags.get(f"{TAG}decision") == "rejected"
                or (require_same_data and fingerprint and h_fingerprint and fingerprint != h_fingerprint)):
            continue
        if h_value is not None and not better(float(value), h_value, direction, margin):
            continue
        if best_value is None or better(float(value), best_value, direction):
            best, best_value = str(mv.version), float(value)
    return best


def _set_alias(tracking: Tracking, name: str, alias: str, version: str, attempts: int = 5) -> None:
    """Point ``alias`` at ``version``; a concurrent first write of the alias is retried (the store inserts it)."""
    for attempt in range(attempts):
        try:
            tracking.client.set_registered_model_alias(name, alias, version)
            return
        except MlflowException as exc:
            text = str(exc).lower()
            if attempt + 1 >= attempts or not ("unique constraint" in text or "duplicate key" in text):
                raise
            time.sleep(random.uniform(0.01, 0.05))


@contextlib.contextmanager
def _registry_lock(tracking: Tracking) -> Iterator[None]:
    """With a local sqlite store, parallel jobs promote one at a time (a file lock next to the database)."""
    db = sqlite_path(tracking.uri)
    if db is None:
        yield
        return
    with file_lock(lock_path(db, "promotion")):
        yield
