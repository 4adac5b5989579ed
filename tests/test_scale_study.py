"""The Optuna side of distributed sweeps (pipelines.orchestration.study): the search space syntax and trials claimed
exactly once by processes sharing one study."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from pipelines.orchestration import study as st


def test_search_space_syntax_of_the_project_config():
    dimensions, fixed = st.parse_space(
        {"trainer.learning_rate": "interval(0.0005, 0.05)", "trainer.batch_size": "choice(16, 32, 64)",
         "model.hidden_layer_sizes": "choice([16], [32], [32,16])", "trainer.alpha": "tag(log, interval(1e-6, 1e-2))",
         "trainer.max_iter": "range(2, 5)", "seed": 3},
        ["model.width=tag(int, interval(1, 4))", "data.n_samples=100"])
    by_key = {d.key: d for d in dimensions}
    assert by_key["trainer.learning_rate"].distribution == FloatDistribution(0.0005, 0.05)
    assert by_key["trainer.alpha"].distribution == FloatDistribution(1e-6, 1e-2, log=True)
    assert by_key["model.width"].distribution == IntDistribution(1, 4)
    assert by_key["trainer.batch_size"].distribution == CategoricalDistribution((16, 32, 64))
    assert by_key["trainer.max_iter"].distribution == CategoricalDistribution((2, 3, 4))
    hidden = by_key["model.hidden_layer_sizes"]
    assert hidden.override("[32,16]") == "model.hidden_layer_sizes=[32,16]"
    assert by_key["trainer.batch_size"].override(32) == "trainer.batch_size=32"
    assert fixed == ["seed=3", "data.n_samples=100"]


def test_search_space_errors_name_the_key():
    with pytest.raises(st.SearchSpaceError, match="trainer.batch_size: repeated choices"):
        st.parse_space({"trainer.batch_size": "choice(16, 16)"})


def _worker(storage: str, name: str, n_trials: int, barrier, results) -> None:
    """Claim trials two at a time until the study has ``n_trials``, as a sweeper worker does."""
    dimensions, _ = st.parse_space({"x": "interval(0.0, 1.0)"})
    study = st.open_study(storage, name, "minimize")
    barrier.wait(timeout=60)
    numbers = []
    while claimed := st.claim_trials(study, storage, n_trials, 2, dimensions):
        for trial, overrides in claimed:
            numbers.append(trial.number)
            study.tell(trial, float(overrides[0].split("=")[1]))
    results.put((numbers, st.claim_close(study, storage, n_trials)))


def test_workers_sharing_a_study_run_each_trial_once_and_one_closes_it(tmp_path):
    storage, name, n_trials, workers = f"sqlite:///{tmp_path / 'optuna.db'}", "shared", 9, 3
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st.open_study(storage, name, "minimize")  # the tables exist before the race on trials
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(workers), context.Queue()
    procs = [context.Process(target=_worker, args=(storage, name, n_trials, barrier, results))
             for _ in range(workers)]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    numbers = sorted(n for claimed, _ in outcomes for n in claimed)
    assert numbers == list(range(n_trials))  # every trial once, none beyond n_trials
    assert sorted(closed for _, closed in outcomes) == [False] * (workers - 1) + [True]
    loaded = optuna.load_study(study_name=name, storage=storage)
    assert [t.state for t in loaded.trials] == [optuna.trial.TrialState.COMPLETE] * n_trials
    assert st.results(loaded)["best_value"] == min(t.value for t in loaded.trials)


def _killed_worker(storage: str, name: str, n_trials: int, claimed) -> None:
    """Claim two trials, finish the first, then hang in the second until killed."""
    dimensions, _ = st.parse_space({"x": "interval(0.0, 1.0)"})
    study = st.open_study(storage, name, "minimize", heartbeat=1)
    (first, _), (second, _) = st.claim_trials(study, storage, n_trials, 2, dimensions)
    study.tell(first, first.params["x"])
    with st.beating(study, [second]):
        claimed.put(second.params["x"])
        threading.Event().wait(120)


def test_a_trial_whose_worker_is_killed_is_failed_and_run_again_once(tmp_path):
    """A worker SIGKILLed in the middle of a trial leaves it RUNNING: without heartbeats the study never ends (its
    trial never finishes, so no worker closes the sweep and registers the best)."""
    storage, name, n_trials = f"sqlite:///{tmp_path / 'optuna.db'}", "killed", 3
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st.open_study(storage, name, "minimize", heartbeat=1)
    context = multiprocessing.get_context("fork")
    claimed = context.Queue()
    worker = context.Process(target=_killed_worker, args=(storage, name, n_trials, claimed))
    worker.start()
    x_of_killed_trial = claimed.get(timeout=60)
    time.sleep(1.5)  # beats recorded while it runs: not stale yet
    study = st.open_study(storage, name, "minimize", heartbeat=1)
    dimensions, _ = st.parse_space({"x": "interval(0.0, 1.0)"})
    mine = st.claim_trials(study, storage, n_trials, 5, dimensions)
    assert len(mine) == 1  # the one trial left: none failed
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(timeout=30)
    with st.beating(study, [trial for trial, _ in mine]):  # this worker lives: its trial stays
        time.sleep(3.5)  # three missed beats of the killed one
        again = st.claim_trials(study, storage, n_trials, 5, dimensions)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert trials[1].state == optuna.trial.TrialState.FAIL  # the killed worker's trial
    assert [t.params["x"] for t, _ in again] == [x_of_killed_trial]  # run again, with its parameters, once
    assert not st.claim_close(study, storage, n_trials)
    for trial, _ in again:
        study.tell(trial, trial.params["x"])
    for trial, _ in mine:
        study.tell(trial, trial.params["x"])
    assert st.claim_trials(study, storage, n_trials, 5, dimensions) == []
    assert st.claim_close(study, storage, n_trials)
    assert st.results(study)["trials"]["complete"] == 3 and st.results(study)["trials"]["fail"] == 1
