"""Sweeps on Ray (``hydra/launcher=ray``, hydra_plugins/ortflow_ray_launcher): a local Ray started for the sweep, a
two-node cluster on this machine (tests/ray_cluster.py) with the PostgreSQL tracking server, a node lost in the
middle of a sweep, and an Optuna study on PostgreSQL whose trials run as Ray tasks; then the faults of
docs/RELIABILITY.md's "Probe round 3 (issue 30): the Ray launcher" (a memory request above every node, a worker
that cannot reach the tracking server, the head killed mid-sweep, a job killed by Ray's memory monitor)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")  # the `ray` extra

import optuna  # noqa: E402
import psutil  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from test_scale_server import _check_sweep, _sweep_runs  # noqa: E402

from bench.concurrency import chain_env  # noqa: E402

pytestmark = pytest.mark.slow

CLUSTER = Path(__file__).with_name("ray_cluster.py")
LEARNING_RATES = "0.002,0.005,0.01,0.02"


class RayNodes:
    """A Ray cluster on 127.0.0.1 run by tests/ray_cluster.py (its own processes): ``address``, ``nodes`` (what the
    script printed per node: ``node_id``, ``head``, ``raylet_pid``, ``pids``) and :meth:`add_node`."""

    def __init__(self, proc: subprocess.Popen, timeout: float):
        self.proc, self._lines = proc, queue.Queue()
        threading.Thread(target=lambda: [self._lines.put(line) for line in proc.stdout], daemon=True).start()
        info = self._read(timeout, "the Ray cluster did not start")
        self.address, self.nodes = info["address"], info["nodes"]

    def _read(self, timeout: float, what: str) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            line = ""
        assert line.strip(), f"{what} within {timeout} s (exit status {self.proc.poll()})"
        info = json.loads(line)
        assert "error" not in info, info["error"]
        return info

    def add_node(self, timeout: float = 120) -> dict:
        """One more node of one CPU on this cluster's head, up when this returns; stopped with the cluster."""
        self.proc.stdin.write("add\n")
        self.proc.stdin.flush()
        node = self._read(timeout, "the added Ray node did not start")
        self.nodes.append(node)
        return node


@contextlib.contextmanager
def ray_nodes(nodes: int, env: dict[str, str], timeout: float = 120):
    """A Ray cluster of ``nodes`` nodes of one CPU each on 127.0.0.1 (tests/ray_cluster.py, its own processes);
    yields a :class:`RayNodes`. Stopped at the end, its leftovers (the added nodes' too) killed by pid."""
    proc = subprocess.Popen([sys.executable, str(CLUSTER), "--nodes", str(nodes), "--cpus", "1"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    cluster = None
    try:
        cluster = RayNodes(proc, timeout)
        yield cluster
    finally:
        proc.stdin.close()  # the script stops its nodes and exits
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        for pid in [pid for node in (cluster.nodes if cluster else []) for pid in node["pids"]]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def _node_env() -> dict[str, str]:
    """The nodes' environment (their workers inherit it): this checkout importable, no MLflow variable (each
    sweep's reach its jobs from the driver)."""
    env = chain_env("")
    del env["MLFLOW_TRACKING_URI"]
    return env


@pytest.fixture(scope="module")
def ray_cluster():
    """A head and a second node, one CPU each, shared by the module's tests on a cluster; the node-loss test adds a
    third node of its own and kills that one (the head and the second node live on)."""
    with ray_nodes(2, _node_env()) as info:
        yield info


def _sweep_cmd(*overrides: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.main", "-m", "hydra/launcher=ray", "experiment=smoke",
            "mlflow.connect_timeout=30", *overrides]


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    begin = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=540)
    seconds = time.perf_counter() - begin
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc, seconds


def _report(what: str, jobs: int, seconds: float, retries: int = 0) -> None:
    print(f"ray sweep, {what}: {jobs} jobs in {seconds:.1f} s ({60 * jobs / seconds:.2f} jobs/min), "
          f"{retries} retried")


def test_local_ray_sweep_on_sqlite(clean_mlflow_env, pipeline_subprocess_env, new_sqlite_store, tmp_path):
    """No address: the launcher starts a Ray on this machine for the sweep; it stops with the command."""
    new_sqlite_store(tmp_path / "mlflow.db")  # the store the sweep opens (its default), its schema made
    cmd = _sweep_cmd("trainer.learning_rate=0.002,0.005", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    proc, seconds = _run(cmd, tmp_path, pipeline_subprocess_env)
    assert "Launching 2 jobs on Ray (local)" in proc.stdout + proc.stderr
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    _check_sweep(client, "ortflow", "ortflow-smoke-regression-mlp_regressor", 2)
    runs, _ = _sweep_runs(client, "ortflow")
    assert all(r.info.status == "FINISHED" for r in runs)
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()) == ["0", "1"]  # the driver's folder
    _report("local Ray, sqlite", 2, seconds)


def test_two_node_cluster_sweep_on_postgres(ray_cluster, postgres_server, clean_mlflow_env, tmp_path):
    cmd = _sweep_cmd(f"trainer.learning_rate={LEARNING_RATES}", f"hydra.launcher.address={ray_cluster.address}",
                     "mlflow.experiment_name=scale-ray", "mlflow.registered_model_name=scale-ray-smoke")
    proc, seconds = _run(cmd, tmp_path, chain_env(postgres_server.url))
    assert f"Launching 4 jobs on Ray ({ray_cluster.address})" in proc.stdout + proc.stderr
    client = MlflowClient(postgres_server.url)
    _check_sweep(client, "scale-ray", "scale-ray-smoke", 4)
    runs, _ = _sweep_runs(client, "scale-ray")
    assert len(runs) == 25 and all(r.info.status == "FINISHED" for r in runs)
    _report("2 nodes x 1 CPU, PostgreSQL", 4, seconds)


def _task_on(raylet_pid: int) -> int | None:
    """The pid of a worker of this raylet that runs a job (Ray titles it ``ray::_run``), if any."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(raylet_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "ray::_run" in " ".join(child.cmdline()):
                    return child.pid
    return None


def _kill_node(raylet_pid: int) -> None:
    """SIGKILL a node's processes at once, as when its machine goes: its raylet and the workers and agents it
    started (alone, the raylet's death leaves a worker running its task to the end)."""
    processes = [psutil.Process(raylet_pid)]
    with contextlib.suppress(psutil.Error):
        processes += processes[0].children(recursive=True)
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()


def test_a_node_lost_mid_sweep(ray_cluster, postgres_server, clean_mlflow_env, tmp_path):
    """A node added to the shared cluster for this test (3 nodes of one CPU: each of the 3 jobs gets a node) has its
    processes SIGKILLed while it runs a job that already made its runs: Ray runs the job again on the nodes left;
    every trial ends with one FINISHED chain, the lost attempt's runs end KILLED with the reason, the best trial is
    registered once. The head and the second node live on for the module's other tests."""
    experiment, model, rates = "scale-ray-loss", "scale-ray-loss-smoke", "0.002,0.005,0.01"
    worker = ray_cluster.add_node()
    cmd = _sweep_cmd(f"trainer.learning_rate={rates}", f"hydra.launcher.address={ray_cluster.address}",
                     f"mlflow.experiment_name={experiment}", f"mlflow.registered_model_name={model}")
    log = open(tmp_path / "driver.log", "w")
    begin = time.perf_counter()
    driver = subprocess.Popen(cmd, cwd=tmp_path, env=chain_env(postgres_server.url), stdout=log,
                              stderr=subprocess.STDOUT)
    killed = False
    try:
        client, victim, deadline = MlflowClient(postgres_server.url), None, time.monotonic() + 240
        while victim is None and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            pid = _task_on(worker["raylet_pid"])
            exp = client.get_experiment_by_name(experiment)
            if pid is not None and exp is not None and client.search_runs(
                    [exp.experiment_id], f"tags.`ortflow.pid` = '{pid}' and tags.`ortflow.stage` = 'train'"):
                victim = pid  # its chain is training: kill the node under it
        assert victim is not None, "no job reached training on the added node"
        _kill_node(worker["raylet_pid"])
        killed = True
        driver.wait(timeout=330)  # within pytest-timeout's 600 s with the wait above
    finally:
        if driver.poll() is None:
            driver.kill()
        log.close()
        if not killed:  # the added node goes in any case: the other tests have the head and the second node
            with contextlib.suppress(psutil.Error):
                _kill_node(worker["raylet_pid"])
    seconds = time.perf_counter() - begin
    output = (tmp_path / "driver.log").read_text()
    assert driver.returncode == 0, output[-4000:]
    runs, sweeps = _sweep_runs(client, experiment)
    assert len(sweeps) == 1 and sweeps[0].info.status == "FINISHED"
    sweep = sweeps[0]
    chains = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == sweep.info.run_id]
    by_trial = defaultdict(list)
    for chain in chains:
        by_trial[chain.data.params["trainer.learning_rate"]].append(chain)
    assert sorted(by_trial, key=float) == rates.split(",")
    lost = [c for c in chains if c.info.status != "FINISHED"]
    assert [c.data.tags["ortflow.pid"] for c in lost] == [str(victim)]  # the attempt on the lost node
    assert lost[0].info.status == "KILLED" and lost[0].data.tags["ortflow.failure_reason"].startswith("lost:")
    for trial, attempts in by_trial.items():  # every trial accounted for: one FINISHED chain of 5 stages
        done = [c for c in attempts if c.info.status == "FINISHED"]
        assert len(done) == 1, (trial, [c.info.status for c in attempts])
        stages = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == done[0].info.run_id]
        assert len(stages) == 5 and all(r.info.status == "FINISHED" for r in stages)
    assert not [r for r in runs if r.info.status == "RUNNING"]  # the lost attempt's stage runs ended too
    assert sweep.data.metrics["jobs_finished"] == 3 and sweep.data.metrics["jobs_lost"] == 1
    versions = client.search_model_versions(f"name='{model}'")
    assert len(versions) == 1  # registered once, by the sweep
    assert versions[0].run_id == client.get_run(sweep.data.tags["ortflow.best_run_id"]).data.tags[
        "ortflow.run.export"]
    assert str(client.get_model_version_by_alias(model, "champion").version) == str(versions[0].version)
    _report("3 nodes x 1 CPU, one lost mid-job, PostgreSQL", 3, seconds, retries=len(lost))


def test_optuna_trials_as_ray_tasks_on_postgres(ray_cluster, postgres_server, clean_mlflow_env, tmp_path):
    study, trials, experiment, model = f"ray-{tmp_path.name}", 3, "scale-ray-optuna", "scale-ray-optuna-smoke"
    cmd = _sweep_cmd("hparams_search=optuna", f"hydra.launcher.address={ray_cluster.address}",
                     f"hydra.sweeper.storage={postgres_server.postgres.optuna_uri}", f"hydra.sweeper.study_name={study}",
                     f"hydra.sweeper.n_trials={trials}", "hydra.sweeper.n_jobs=2",
                     f"mlflow.experiment_name={experiment}", f"mlflow.registered_model_name={model}")
    proc, seconds = _run(cmd, tmp_path, chain_env(postgres_server.url))
    output = proc.stdout + proc.stderr
    assert "Launching 2 jobs on Ray" in output and "Launching 1 jobs on Ray" in output  # batches of n_jobs
    loaded = optuna.load_study(study_name=study, storage=postgres_server.postgres.optuna_uri)
    assert len(loaded.trials) == trials and all(t.state == optuna.trial.TrialState.COMPLETE for t in loaded.trials)
    sweep, chains = _check_sweep(MlflowClient(postgres_server.url), experiment, model, trials)
    assert sweep.data.metrics["best_objective"] == pytest.approx(loaded.best_value)
    _report("Optuna, 2 nodes x 1 CPU, PostgreSQL study", trials, seconds)


# --- reliability probe, round 3 (issue 30; docs/RELIABILITY.md): each fault ends in a clear error, nothing RUNNING ---


def _failed_sweep(uri: str, experiment: str = "ortflow"):
    """The store's runs after a sweep that stopped: its one sweep run (FAILED, with the reason), none RUNNING and
    nothing registered; returns (sweep run, every run)."""
    client = MlflowClient(uri)
    runs, sweeps = _sweep_runs(client, experiment)
    assert len(sweeps) == 1 and sweeps[0].info.status == "FAILED", [(r.info.run_name, r.info.status) for r in runs]
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    assert not client.search_registered_models()
    return sweeps[0], runs


def _stopped_sweep(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 240) -> tuple[str, float]:
    """Run a sweep that must stop on an expected error: status 2, one ``ortflow: error: SweepError`` line and no
    traceback; returns its output and wall time."""
    begin = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    seconds, output = time.perf_counter() - begin, proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-4000:]
    assert "ortflow: error: SweepError: the sweep stopped: " in output and "Traceback" not in output, output[-4000:]
    print(next(line for line in output.splitlines() if line.startswith("ortflow: error:")))
    return output, seconds


def test_a_job_asking_more_memory_than_any_node_is_refused_before_launch(ray_cluster, new_sqlite_store,
                                                                          clean_mlflow_env, tmp_path):
    """``hydra.launcher.remote.memory`` above every node's: Ray would leave the tasks pending for ever (only its
    autoscaler logs 'No available node types can fulfill resource request'); the launcher refuses before any job,
    naming the request and the largest node, and the sweep run ends FAILED with that reason."""
    uri = new_sqlite_store(tmp_path / "mlflow.db")
    cmd = _sweep_cmd("trainer.learning_rate=0.002,0.005", f"hydra.launcher.address={ray_cluster.address}",
                     f"+hydra.launcher.remote.memory={2**40}")
    output, seconds = _stopped_sweep(cmd, tmp_path, chain_env(uri))
    refused = ("RayResourceError: each job asks Ray for CPU=1, memory=1024.0 GiB but no node of the cluster at "
               f"{ray_cluster.address} (2 node(s)) has that much: memory short, the largest node has CPU=1, memory=")
    assert refused in output
    assert "Launching" not in output  # before any job
    sweep, runs = _failed_sweep(uri)
    assert len(runs) == 1 and sweep.data.tags["ortflow.failure_reason"].startswith("RayResourceError: each job asks")
    print(f"memory request refused in {seconds:.1f} s")


def test_a_worker_that_cannot_reach_the_tracking_server_fails_the_sweep_naming_it(ray_cluster, new_sqlite_store,
                                                                                    clean_mlflow_env, tmp_path):
    """The jobs see a tracking URI nothing answers (a closed port on 127.0.0.1, given to the workers alone through
    ``hydra.launcher.runtime_env``, as a server the driver reaches and a worker does not): each job fails at once,
    naming the URI, and cannot record that; the error comes back to the driver, which stops the sweep with it
    (status 2) and ends the sweep run FAILED. It used to end FINISHED with ``jobs=0`` and status 0."""
    from pipelines.server import free_port

    uri, unreachable = new_sqlite_store(tmp_path / "mlflow.db"), f"http://127.0.0.1:{free_port()}"
    cmd = _sweep_cmd("trainer.learning_rate=0.002,0.005", f"hydra.launcher.address={ray_cluster.address}",
                     f"+hydra.launcher.runtime_env.env_vars.MLFLOW_TRACKING_URI={unreachable}")
    output, seconds = _stopped_sweep(cmd, tmp_path, chain_env(uri))
    refused = f"TrackingUnavailableError: the MLflow tracking server {unreachable} is unreachable (/health: "
    assert f"SweepError: the sweep stopped: {refused}" in output
    assert f"failed: {refused}" in output  # the driver names the job (Ray job #i (overrides) failed: ...)
    sweep, runs = _failed_sweep(uri)
    assert len(runs) == 1 and sweep.data.tags["ortflow.failure_reason"].startswith(refused)
    print(f"unreachable tracking server reported in {seconds:.1f} s")


def test_the_head_node_killed_mid_sweep_stops_the_sweep_and_ends_its_runs(new_sqlite_store, clean_mlflow_env,
                                                                          tmp_path):
    """A cluster of its own (the head alone, one CPU: one job runs, the other waits) loses its head (GCS, raylet,
    workers: SIGKILL) while a job's stage runs: Ray would leave the driver waiting, then end it after 60 s without
    any cleanup (every run RUNNING for ever). The launcher notices the head refusing connections, and after
    ``hydra.launcher.head_timeout`` stops the sweep: status 2, an error naming the cluster and the jobs that did
    not return, the sweep run FAILED and the lost job's runs KILLED, each with the reason."""
    uri = new_sqlite_store(tmp_path / "mlflow.db")
    with ray_nodes(1, _node_env()) as cluster:
        cmd = _sweep_cmd("trainer.learning_rate=0.002,0.005", f"hydra.launcher.address={cluster.address}",
                         "hydra.launcher.head_timeout=5")
        log = open(tmp_path / "driver.log", "w")
        driver = subprocess.Popen(cmd, cwd=tmp_path, env=chain_env(uri), stdout=log, stderr=subprocess.STDOUT)
        try:
            client, deadline, stage = MlflowClient(uri), time.monotonic() + 240, []
            while not stage and driver.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
                exp = client.get_experiment_by_name("ortflow")
                stage = exp and client.search_runs([exp.experiment_id], "tags.`ortflow.stage` LIKE '%'")
            assert stage, "no job made a stage run"
            _kill_node(cluster.nodes[0]["raylet_pid"])  # its workers and agents
            for pid in cluster.nodes[0]["pids"]:  # and the GCS
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).kill()
            killed = time.perf_counter()
            driver.wait(timeout=120)
            seconds = time.perf_counter() - killed
        finally:
            if driver.poll() is None:
                driver.kill()
            log.close()
    output = (tmp_path / "driver.log").read_text()
    assert driver.returncode == 2, output[-4000:]
    lost = (f"RayClusterLostError: the Ray cluster at {cluster.address} was lost: its head (GCS {cluster.address}) "
            "has not accepted a connection for 5 s (ConnectionRefusedError")
    assert f"ortflow: error: SweepError: the sweep stopped: {lost}" in output and "Traceback" not in output
    assert "2 of 2 jobs never returned (#0, #1)" in output
    sweep, runs = _failed_sweep(uri)
    assert sweep.data.tags["ortflow.failure_reason"].startswith(lost)
    killed_runs = [r for r in runs if r.info.status == "KILLED"]
    assert {r.data.tags.get("ortflow.pipeline") for r in killed_runs} >= {"main"}  # the job's chain run
    assert all(r.data.tags["ortflow.failure_reason"].startswith(f"lost: {lost}") for r in killed_runs)
    print(f"head lost: the driver ended {seconds:.1f} s after the kill")


def test_a_job_killed_by_rays_memory_monitor_stops_the_sweep_naming_memory(new_sqlite_store, clean_mlflow_env,
                                                                           tmp_path):
    """A cluster of its own (the head alone) whose memory monitor finds the node over its threshold
    (``RAY_memory_usage_threshold=0.01``: every job is over it, as a job filling a node's memory would be), so Ray's
    OOM killer ends each job's worker. Ray used to run a killed job again without limit (the driver still waited
    after 180 s); the launcher gives it ``max_retries`` (1 here), then the job comes back lost with Ray's reason and
    the sweep stops naming memory: status 2, the sweep run FAILED, nothing RUNNING."""
    uri = new_sqlite_store(tmp_path / "mlflow.db")
    env = {**_node_env(), "RAY_memory_usage_threshold": "0.01", "RAY_memory_monitor_refresh_ms": "100"}
    with ray_nodes(1, env) as cluster:
        cmd = _sweep_cmd("trainer.learning_rate=0.002", f"hydra.launcher.address={cluster.address}",
                         "hydra.launcher.max_retries=1")
        output, seconds = _stopped_sweep(cmd, tmp_path, chain_env(uri))
    oom = "RayJobLostError: Ray job #0 (experiment=smoke mlflow.connect_timeout=30 trainer.learning_rate=0.002) " \
          "was lost: OutOfMemoryError: "
    assert f"SweepError: the sweep stopped: {oom}" in output and "running low on memory" in output
    sweep, runs = _failed_sweep(uri)
    assert sweep.data.tags["ortflow.failure_reason"].startswith(oom)
    print(f"job killed for memory: the sweep stopped in {seconds:.1f} s")
