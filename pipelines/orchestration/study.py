"""An Optuna study that several processes (machines) share through its storage, and the search space syntax.

The sweeper (``hydra_plugins/ortflow_optuna_sweeper``) asks trials here and the sweep callback
(pipelines.orchestration.sweep_callback) finds the sweep's MLflow run and who closes it here. Workers started with the same ``storage`` and ``study_name``
join one study. What must happen once across them happens under :func:`study_lock`, a lock held by one process
at a time: a file lock next to a sqlite storage, a PostgreSQL advisory lock on a ``postgresql://`` one
(in-memory storage: one process, nothing to lock). Under it:

- :func:`claim_trials` counts the study's trials and asks only what is left of ``n_trials``: the trials requested
  run exactly once in total, however many workers join. A worker records a heartbeat for each trial it runs
  (:func:`beating`); a trial whose worker missed three beats (the worker was killed, its machine lost) is failed
  and asked again once, with the same parameters, by the next worker that claims trials (Optuna's heartbeat and
  ``RetryHeartbeatStaleTrialCallback``): the retry takes the failed trial's place in ``n_trials``;
- :func:`once` reads or sets a study attribute (the sweep's MLflow run id: the first worker creates the run, the
  others nest under it);
- :func:`claim_close` lets exactly one worker close the sweep: the first that finds every trial finished.

Search space values use the syntax of Hydra's sweep overrides: ``choice(16, 32)``, ``range(1, 5)``,
``interval(0.001, 0.1)``, ``tag(log, interval(1e-4, 1e-1))``, ``tag(int, interval(8, 64))``; any other value
is fixed for every trial.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback, fail_stale_trials
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import TrialState

from ..base import periodic
from ..tracking import file_lock, lock_path, sqlite_path

FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
CLOSED_ATTR = "ortflow.sweep_closed"
#: a worker records a heartbeat for each trial it runs this often (seconds); three missed beats fail the trial
HEARTBEAT_SECONDS = 20


class SearchSpaceError(ValueError):
    """A search space entry that cannot become an Optuna distribution; the message names the key."""


@dataclass
class Dimension:
    """One swept key: its Optuna distribution and, for choices, the override text of each choice."""

    key: str
    distribution: BaseDistribution
    texts: dict[Any, str] | None = None

    def override(self, value: Any) -> str:
        return f"{self.key}={self.texts[value] if self.texts is not None else value}"


def parse_space(params: Mapping[str, Any] | None, arguments: list[str] = ()) -> tuple[list[Dimension], list[str]]:
    """``(dimensions, fixed overrides)`` from the config's ``params`` and the command line's ``key=value``s."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    texts = [f"{key}={value}" for key, value in (params or {}).items()] + list(arguments)
    dimensions, fixed = [], []
    for override in parser.parse_overrides(texts):
        if override.is_sweep_override():
            dimensions.append(_dimension(override))
        else:
            fixed.append(override.input_line)
    return dimensions, fixed


def _dimension(override: Any) -> Dimension:
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    key, sweep = override.get_key_element(), override.value()
    if isinstance(sweep, IntervalSweep):
        log = "log" in sweep.tags
        if "int" in sweep.tags:  # Hydra's interval() is always float
            return Dimension(key, IntDistribution(int(sweep.start), int(sweep.end), log=log))
        return Dimension(key, FloatDistribution(float(sweep.start), float(sweep.end), log=log))
    if isinstance(sweep, (ChoiceSweep, RangeSweep)):
        forms = list(override.sweep_string_iterator())
        values = list(override.sweep_iterator()) if isinstance(sweep, RangeSweep) else list(sweep.list)
        # Optuna stores numbers, strings, booleans and None; a list choice ([32,16]) is stored as its text
        choices = [v if v is None or isinstance(v, (bool, int, float, str)) else form for v, form in zip(values, forms)]
        if len(set(map(repr, choices))) != len(choices):
            raise SearchSpaceError(f"search space {key}: repeated choices {forms}")
        return Dimension(key, CategoricalDistribution(choices), dict(zip(choices, forms)))
    raise SearchSpaceError(f"search space {key}: {override.input_line!r} is not choice(), range() or interval()")


def describe(dimensions: list[Dimension]) -> dict[str, str]:
    """The search space as text, one entry per key (logged on the sweep's run)."""
    return {d.key: repr(d.distribution) for d in dimensions}


# ------------------------------------------------------------------------------------------------ shared study


def open_study(storage: str | None, study_name: str, direction: str,
               sampler: optuna.samplers.BaseSampler | None = None, heartbeat: int = HEARTBEAT_SECONDS) -> optuna.Study:
    """Create the study, or load it when another worker made it first. On a database ``storage`` the trials get
    heartbeats every ``heartbeat`` seconds (the workers of one study must agree on it)."""
    with study_lock(storage, study_name):
        return optuna.create_study(storage=_storage(storage, heartbeat), study_name=study_name, direction=direction,
                                   sampler=sampler, load_if_exists=True)


def _storage(url: str | None, heartbeat: int) -> RDBStorage | None:
    """The study's storage: a trial whose heartbeat is 3 x ``heartbeat`` seconds old is failed and retried once."""
    if not url:
        return None
    with _quiet():
        return RDBStorage(url, heartbeat_interval=heartbeat, grace_period=3 * heartbeat,
                          heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without Optuna's warnings that its heartbeat API is experimental and meant for ``Study.optimize`` (the
    sweeper asks and tells trials itself)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        yield


def _heartbeats(study: optuna.Study) -> BaseHeartbeat | None:
    storage = study._storage  # where Optuna's own fail_stale_trials looks too
    if isinstance(storage, BaseHeartbeat) and storage.get_heartbeat_interval():
        return storage
    return None


def beating(study: optuna.Study, trials: list[optuna.Trial]) -> contextlib.AbstractContextManager:
    """Record a heartbeat for ``trials`` every heartbeat interval while the body runs (a thread; nothing without
    heartbeats, e.g. in memory)."""
    storage = _heartbeats(study)
    if storage is None or not trials:
        return contextlib.nullcontext()

    def beat() -> None:
        for trial in trials:
            storage.record_heartbeat(trial._trial_id)

    return periodic.every(storage.get_heartbeat_interval(), beat, "ortflow-trial-heartbeat")


@contextlib.contextmanager
def study_lock(storage: str | None, study_name: str) -> Iterator[None]:
    """Held by one process at a time among those sharing ``storage``'s study ``study_name``."""
    if not storage:
        yield
        return
    db = sqlite_path(storage)
    if db is not None:
        with file_lock(lock_path(db, f"study-{_key(study_name)}")):
            yield
        return
    if storage.startswith("postgresql"):
        from sqlalchemy import text

        with _engine(storage).connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _key(study_name)})
            try:
                yield
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _key(study_name)})
        return
    raise ValueError(f"hydra.sweeper.storage={storage!r}: shared studies are supported on sqlite:/// and "
                     "postgresql:// storages (the workers coordinate through a lock there)")


@functools.lru_cache(maxsize=8)
def _engine(url: str) -> Any:
    from sqlalchemy import create_engine

    return create_engine(url, pool_pre_ping=True)


def _key(study_name: str) -> int:
    """A stable 31-bit number naming the study's lock."""
    return zlib.crc32(f"ortflow.study:{study_name}".encode()) & 0x7FFFFFFF


def claim_trials(study: optuna.Study, storage: str | None, n_trials: int, batch: int,
                 dimensions: list[Dimension]) -> list[tuple[optuna.Trial, list[str]]]:
    """Ask up to ``batch`` trials, never more than what is left of ``n_trials`` in the whole study; each with its
    sampled values as overrides. Trials whose worker stopped beating are failed first; their retries (same
    parameters) are asked before new trials and take their places in ``n_trials``."""
    space = {d.key: d.distribution for d in dimensions}
    with study_lock(storage, study.study_name), _quiet():
        fail_stale_trials(study)
        trials = study.get_trials(deepcopy=False)
        retried = {RetryHeartbeatStaleTrialCallback.retried_trial_number(t) for t in trials} - {None}
        used = sum(1 for t in trials if t.number not in retried and t.state != TrialState.WAITING)
        asked = [study.ask(space) for _ in range(max(0, min(batch, n_trials - used)))]  # waiting retries first
        heartbeats = _heartbeats(study)
        for trial in asked if heartbeats is not None else ():
            heartbeats.record_heartbeat(trial._trial_id)
    return [(trial, [d.override(trial.params[d.key]) for d in dimensions]) for trial in asked]


def once(study: optuna.Study, storage: str | None, key: str, make: Callable[[], str]) -> str:
    """The study's user attribute ``key``; the first caller sets it to ``make()``."""
    with study_lock(storage, study.study_name):
        value = study.user_attrs.get(key)
        if value is None:
            value = make()
            study.set_user_attr(key, value)
        return value


def claim_close(study: optuna.Study, storage: str | None, n_trials: int) -> bool:
    """True for exactly one caller: the first that finds ``n_trials`` trials, all finished."""
    with study_lock(storage, study.study_name):
        trials = study.get_trials(deepcopy=False)
        if study.user_attrs.get(CLOSED_ATTR) or len(trials) < n_trials or any(t.state not in FINISHED
                                                                               for t in trials):
            return False
        study.set_user_attr(CLOSED_ATTR, True)
        return True


def results(study: optuna.Study) -> dict[str, Any]:
    """What the study found: the best value, trial and parameters (a list choice as its override text), and the
    trial counts by state."""
    counts = {state.name.lower(): 0 for state in TrialState}
    for trial in study.get_trials(deepcopy=False):
        counts[trial.state.name.lower()] += 1
    out: dict[str, Any] = {"study_name": study.study_name, "direction": study.direction.name.lower(),
                           "trials": counts}
    if counts["complete"]:
        best = study.best_trial
        out.update(best_value=best.value, best_trial=best.number, best_params=dict(best.params))
    return out


__all__ = ["Dimension", "SearchSpaceError", "parse_space", "describe", "open_study", "study_lock", "claim_trials",
           "beating", "once", "claim_close", "results"]
