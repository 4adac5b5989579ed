"""Many writers on one fresh embedded sqlite store (issue: two chains started together on a new mlflow.db crashed
while MLflow created its schema)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipelines.tracking import setup

WORKERS = 4
ROUNDS = 3


def _setup_at_once(cfg, barrier, results) -> None:
    """One process: wait for the others, then connect to the (new) store as every pipeline entry point does."""
    try:
        barrier.wait(timeout=60)
        setup(cfg)
        results.put("ok")
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        results.put(f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")


def test_processes_starting_together_on_a_new_sqlite_store_all_connect(compose_pipeline, clean_mlflow_env,
                                                                        tmp_path):
    # fork: the workers share the parent's imports and reach setup() within milliseconds of each other, as two
    # `python -m pipelines.main` started together do once their imports are done
    context = multiprocessing.get_context("fork")
    for round_ in range(ROUNDS):
        uri = f"sqlite:///{tmp_path / f'round{round_}' / 'mlflow.db'}"
        cfg = compose_pipeline(f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path / f'round{round_}'}")
        barrier, results = context.Barrier(WORKERS), context.Queue()
        procs = [context.Process(target=_setup_at_once, args=(cfg, barrier, results)) for _ in range(WORKERS)]
        for proc in procs:
            proc.start()
        outcomes = [results.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
        assert outcomes == ["ok"] * WORKERS, (round_, outcomes)
        client = MlflowClient(uri)
        assert [e.name for e in client.search_experiments()].count("ortflow") == 1
        assert client.search_registered_models() == []  # the registry tables exist too


@pytest.mark.slow
def test_chains_at_once_on_a_fresh_sqlite_store(clean_mlflow_env, tmp_path):
    from bench.concurrency import audit, run_chains

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # does not exist yet: the chains race to create it
    outcome = run_chains(4, uri, tmp_path, "scale-sqlite", "scale-sqlite-smoke")
    assert outcome.failed == 0, [o[-3000:] for o in outcome.outputs]
    found = audit(uri, "scale-sqlite", "scale-sqlite-smoke", 4)
    assert found.problems == [] and found.finished == found.runs == 24
    assert found.metric_points == found.expected_points == 36 and found.versions == 4


def test_slurm_launcher_config_composes(compose_pipeline):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(__file__).parent.parent / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm", "hparams_search=optuna"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher.timeout_min, launcher.cpus_per_task, launcher.array_parallelism) == (60, 2, 16)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_ == "hydra_plugins.ortflow_optuna_sweeper.sweeper.OrtflowOptunaSweeper"
    assert sweeper.params["trainer.batch_size"] == "choice(16, 32, 64)" and sweeper.storage is None


def test_ray_launcher_config_composes_and_checks_its_settings(compose_pipeline):
    """hydra/launcher=ray composes without Ray installed (Ray is imported when a sweep launches); bad settings are
    named when Hydra instantiates the launcher."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    def launcher(*overrides):
        with initialize_config_dir(config_dir=str(Path(__file__).parent.parent / "conf"), version_base="1.3"):
            return compose("config", overrides=["hydra/launcher=ray", *overrides], return_hydra_config=True)

    cfg = launcher("hydra.launcher.address=127.0.0.1:6379", "hydra.launcher.num_cpus=2")
    ray_launcher = instantiate(cfg.hydra.launcher)
    assert type(ray_launcher).__name__ == "RayLauncher"
    assert (ray_launcher.address, ray_launcher.num_cpus, ray_launcher.max_retries) == ("127.0.0.1:6379", 2, 3)
    assert ray_launcher.env_prefixes == ("MLFLOW_", "ORTFLOW_") and ray_launcher.init == {"include_dashboard": False}
    for override, named in (("hydra.launcher.num_cpus=0", "hydra.launcher.num_cpus=0"),
                            ("hydra.launcher.max_retries=-2", "hydra.launcher.max_retries=-2")):
        with pytest.raises(Exception, match=named):
            instantiate(launcher(override).hydra.launcher)
