"""``hydra/sweeper=ortflow_optuna``: an Optuna study driving Hydra jobs, on a current Optuna.

Keys (``hydra.sweeper.*``): ``direction`` (minimize | maximize), ``n_trials`` (in total, over every worker of
the study), ``n_jobs`` (trials per batch handed to the launcher), ``sampler`` (an Optuna sampler to instantiate,
``_target_`` and its arguments, e.g. ``seed``), ``storage`` (None: in memory; ``sqlite:///...`` or
``postgresql://...``: shared), ``study_name`` and ``params`` (key -> ``choice(...)``, ``range(...)``,
``interval(...)``, ``tag(log, interval(...))`` or a fixed value). Sweep overrides on the command line join the
search space. Worker processes started with the same ``storage`` and ``study_name`` share one study: together they
run ``n_trials`` trials, each exactly once, except that a trial whose worker was killed (no heartbeat for a
minute) is failed and run once more by the next worker that claims trials (see pipelines.orchestration.study).
Each worker writes ``search_space.yaml`` and, at the end, ``optimization_results.yaml`` (the whole study's best)
into its sweep folder.

This module is imported whenever Hydra starts (plugin discovery): Optuna is imported only when a sweep runs.
"""


import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

_log = logging.getLogger(__name__)


@dataclass
class OrtflowOptunaSweeperConf:
    _target_: str = "hydra_plugins.ortflow_optuna_sweeper.sweeper.OrtflowOptunaSweeper"
    direction: str = "minimize"
    n_trials: int = 20
    n_jobs: int = 1
    sampler: Any = field(default_factory=lambda: {"_target_": "optuna.samplers.TPESampler", "seed": None})
    storage: Optional[str] = None
    study_name: Optional[str] = None
    params: Optional[Dict[str, Any]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="ortflow_optuna", node=OrtflowOptunaSweeperConf,
                             provider="ortflow")


class OrtflowOptunaSweeper(Sweeper):
    def __init__(self, direction: str, n_trials: int, n_jobs: int, sampler: Any, storage: Optional[str],
                 study_name: Optional[str], params: Optional[DictConfig]) -> None:
        if direction not in ("minimize", "maximize"):
            raise ValueError(f"hydra.sweeper.direction={direction!r}: use minimize or maximize")
        if n_trials < 1 or n_jobs < 1:
            raise ValueError(f"hydra.sweeper.n_trials={n_trials} and n_jobs={n_jobs} must be >= 1")
        if storage and not study_name:
            raise ValueError("hydra.sweeper.storage is set: give hydra.sweeper.study_name too (the workers of one "
                             "study find it by that name)")
        self.direction, self.n_trials, self.n_jobs = direction, n_trials, n_jobs
        self.sampler, self.storage, self.study_name = sampler, storage or None, study_name
        self.params = OmegaConf.to_container(params, resolve=True) if isinstance(params, DictConfig) else params
        self.job_idx = 0

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> Dict[str, Any]:
        from optuna.trial import TrialState

        from pipelines.orchestration import study as st

        dimensions, fixed = st.parse_space(self.params, arguments)
        if not dimensions:
            raise st.SearchSpaceError("the Optuna sweep has nothing to search: give hydra.sweeper.params or sweep "
                                      "overrides such as trainer.learning_rate='interval(0.001,0.1)'")
        from pipelines.orchestration.sweep_checks import selection

        chosen = selection(self.config, dimensions)
        if chosen.why:  # the trials' own losses do not compare: each returns the metric they share
            fixed = [f for f in fixed if not f.startswith("optimized_metric=")] + [f"optimized_metric={chosen.metric}"]
            self.direction = chosen.direction
            _log.info("%s", chosen.why)
        if self.storage and self.sampler is not None and hasattr(self.sampler, "reseed_rng"):
            self.sampler.reseed_rng()  # workers of one study with one seed would all propose the same points
        name = self.study_name or f"ortflow-{Path(str(self.config.hydra.sweep.dir)).name}"
        study = st.open_study(self.storage, name, self.direction, self.sampler)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create({"study_name": name, "direction": self.direction, "n_trials": self.n_trials,
                                         "storage": _safe(self.storage), "fixed": fixed,
                                         "params": st.describe(dimensions)}), sweep_dir / "search_space.yaml")
        while True:
            claimed = st.claim_trials(study, self.storage, self.n_trials, self.n_jobs, dimensions)
            if not claimed:
                break
            batch = [fixed + overrides for _, overrides in claimed]
            self.validate_batch_is_legal(batch)
            with st.beating(study, [trial for trial, _ in claimed]):  # a worker killed here: its trials are retried
                returns = self.launcher.launch(batch, initial_job_idx=self.job_idx)
            self.job_idx += len(returns)
            # skip_if_finished: a worker stalled for three heartbeats (a suspended machine) finds its trial failed and
            # already retried by another worker; Optuna then warns instead of raising
            for (trial, _), ret in zip(claimed, returns):
                value = ret.return_value if ret.status == JobStatus.COMPLETED else None
                if isinstance(value, (int, float)) and math.isfinite(value):
                    study.tell(trial, float(value), skip_if_finished=True)
                else:  # a failed job (pipelines return +-inf for them) or no number: Optuna steers away
                    study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        found = st.results(study)
        OmegaConf.save(OmegaConf.create({"name": "ortflow_optuna", **found}), sweep_dir / "optimization_results.yaml")
        _log.info("Optuna study %s: %s", name, found)
        return found


def _safe(storage: Optional[str]) -> Optional[str]:
    """The storage URL without a password."""
    if not storage or "@" not in storage or "://" not in storage:
        return storage
    scheme, rest = storage.split("://", 1)
    credentials, host = rest.rsplit("@", 1)
    return f"{scheme}://{credentials.split(':', 1)[0]}@{host}"
