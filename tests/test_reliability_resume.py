"""Reliability: a train stage killed by SIGKILL resumes from the checkpoint it logged to MLflow while training.

Real components only: a sqlite tracking store in tmp_path, ``python -m pipelines.train`` in a subprocess killed
with SIGKILL once its run shows a checkpoint, the train stage run again with ``trainer.resume_from``, and an
uninterrupted run with the same seed and config to compare the trained weights with.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import numpy as np
import onnx
import pytest
from mlflow import MlflowClient
from onnx import numpy_helper

from pipelines.execution.bundle import Bundle
from pipelines.tracking.checkpoints import (BACKUP_SUFFIX, MANIFEST, RESUMED_BY_TAG, RESUMED_FROM_EPOCH_TAG,
                                   RESUMED_FROM_RUN_TAG, RESUMED_FROM_TAG, check_folder)
from pipelines.execution.runner import execute_stage, prepare
from pipelines.stages.train import train

# enough epochs that the killed run, writing and logging a checkpoint every epoch, trains for a few seconds
EPOCHS = 1000
TRAINERS = {
    "full": ["trainer=full"],
    "fwbw": ["trainer=fwbw", "trainer.optimizer=nesterov"],  # momentum is part of the state
}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, new_sqlite_store, run_chain_clean):
    """One sqlite store for the module (conftest.new_sqlite_store) and an add_loss run in it."""
    folder = tmp_path_factory.mktemp("resume")
    uri = new_sqlite_store(folder / "mlflow.db")
    result = run_chain_clean(["experiment=smoke", f"mlflow.tracking_uri={uri}", f"mlflow.root={folder}",
                              "stages=[convert,add_loss]"], folder / "prepare")
    return folder, uri, result.stage_run_ids["add_loss"]


def _base(folder, uri, add_loss_run, trainer):
    # shuffle is on (the default): the random state must be restored too; one experiment per trainer
    return ["experiment=smoke", f"mlflow.tracking_uri={uri}", f"mlflow.root={folder}",
            f"mlflow.experiment_name=resume-{trainer}", f"source.run_id={add_loss_run}", *TRAINERS[trainer],
            f"trainer.max_iter={EPOCHS}"]


def _train_in_process(compose_pipeline, work_dir, *overrides):
    cfg = compose_pipeline(*overrides)
    return execute_stage("train", train, cfg, prepare(cfg), Bundle.from_source(cfg.source), work_dir)["run_id"]


def _wait_for(what, predicate, proc, log, timeout=120.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            pytest.fail(f"the train process ended ({proc.returncode}) before {what}:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {timeout} s:\n{log.read_text()[-4000:]}")
        time.sleep(0.05)


def _kill_once_checkpointed(cmd, folder, env, log, client, find_train_run):
    """Start ``cmd``, SIGKILL it once the train run ``find_train_run()`` returns has a checkpoint; that run's id."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        killed = _wait_for("a train run", find_train_run, proc, log)
        _wait_for("a logged checkpoint", lambda: MANIFEST in {
            Path(f.path).name for f in client.list_artifacts(killed, "checkpoint")}, proc, log)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return killed


def _train_runs(client, experiment_name):
    experiment = client.get_experiment_by_name(experiment_name)
    runs = client.search_runs([experiment.experiment_id], "tags.`ortflow.stage` = 'train'") if experiment else []
    return runs[0].info.run_id if runs else None


def _weights(uri, run_id):
    path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="graphs/trained_model.onnx",
                                               tracking_uri=uri)
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def _losses(client, run_id):
    return {m.step: m.value for m in client.get_metric_history(run_id, "train_loss")}


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_killed_train_run_resumes_from_its_logged_checkpoint(trainer, prepared, compose_pipeline, clean_mlflow_env,
                                                             tmp_path, pipeline_subprocess_env):
    folder, uri, add_loss_run = prepared
    client = MlflowClient(uri)
    base = _base(folder, uri, add_loss_run, trainer)

    # 1. the train stage as a user starts it, killed by SIGKILL once a checkpoint is in its run's artifacts
    env = dict(pipeline_subprocess_env, MLFLOW_TRACKING_URI=uri)
    cmd = [sys.executable, "-m", "pipelines.train", *(o for o in base if not o.startswith("mlflow.tracking_uri=")),
           "trainer.checkpoint_every=1",
           f"hydra.run.dir={tmp_path / 'killed'}"]
    killed = _kill_once_checkpointed(cmd, folder, env, tmp_path / "killed.log", client,
                                     lambda: _train_runs(client, f"resume-{trainer}"))
    assert client.get_run(killed).info.status == "RUNNING"  # nobody could end it

    # 2. resumed from it (the fwbw case with the shorthand: the run id alone means its checkpoint/)
    resume_from = killed if trainer == "fwbw" else f"runs:/{killed}/checkpoint"
    resumed = _train_in_process(compose_pipeline, tmp_path / "resumed", *base, f"trainer.resume_from={resume_from}",
                                "trainer.checkpoint_every=500")
    resumed_run = client.get_run(resumed)
    assert resumed_run.info.status == "FINISHED"
    tags = resumed_run.data.tags
    assert tags[RESUMED_FROM_RUN_TAG] == killed
    assert tags[RESUMED_FROM_TAG] in (f"runs:/{killed}/checkpoint", f"runs:/{killed}/checkpoint{BACKUP_SUFFIX}")
    start = int(tags[RESUMED_FROM_EPOCH_TAG])
    assert 1 <= start < EPOCHS
    # the new run holds the whole curve: the checkpoint's epochs (logged when training begins), then its own
    resumed_losses = _losses(client, resumed)
    assert sorted(resumed_losses) == list(range(1, EPOCHS + 1))
    assert resumed_run.data.metrics["n_epochs"] == EPOCHS
    assert resumed_run.data.metrics["checkpoints_logged"] >= 1
    history = json.loads(Path(mlflow.artifacts.download_artifacts(
        run_id=resumed, artifact_path="history/history.json", tracking_uri=uri)).read_text())
    assert [r["epoch"] for r in history] == list(range(1, EPOCHS + 1))
    # its own checkpoint, logged while it trained, is complete
    assert check_folder(mlflow.artifacts.download_artifacts(run_id=resumed, artifact_path="checkpoint",
                                                            tracking_uri=uri)) == "ok"

    # 3. the killed run is closed, naming the run that resumed it
    killed_run = client.get_run(killed)
    assert killed_run.info.status == "KILLED"
    assert killed_run.data.tags[RESUMED_BY_TAG] == resumed

    # 4. the same weights and losses as an uninterrupted run with the same seed and config
    reference = _train_in_process(compose_pipeline, tmp_path / "reference", *base)
    expected, got = _weights(uri, reference), _weights(uri, resumed)
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
    reference_losses = _losses(client, reference)
    np.testing.assert_allclose([resumed_losses[s] for s in sorted(resumed_losses)],
                               [reference_losses[s] for s in sorted(resumed_losses)], rtol=1e-5)
    np.testing.assert_allclose([r["train_loss"] for r in history],
                               [reference_losses[s] for s in range(1, EPOCHS + 1)], rtol=1e-5)


def test_killed_chain_parent_is_closed_when_its_train_stage_is_resumed(prepared, compose_pipeline, clean_mlflow_env,
                                                                       tmp_path, pipeline_subprocess_env):
    """``python -m pipelines.main`` killed while training leaves the chain's parent and its train run RUNNING;
    resuming the train run ends both as KILLED, naming the run that took over."""
    folder, uri, _ = prepared
    client = MlflowClient(uri)
    experiment_name = "resume-chain"
    overrides = ["experiment=smoke", f"mlflow.root={folder}", f"mlflow.experiment_name={experiment_name}",
                 "stages=[convert,add_loss,train]", *TRAINERS["full"], f"trainer.max_iter={EPOCHS}"]
    env = dict(pipeline_subprocess_env, MLFLOW_TRACKING_URI=uri)
    cmd = [sys.executable, "-m", "pipelines.main", *overrides, "trainer.checkpoint_every=1",
           f"hydra.run.dir={tmp_path / 'killed'}"]
    killed = _kill_once_checkpointed(cmd, folder, env, tmp_path / "killed.log", client,
                                     lambda: _train_runs(client, experiment_name))
    parent = client.get_run(killed).data.tags["mlflow.parentRunId"]
    assert client.get_run(parent).data.tags["ortflow.pipeline"] == "main"
    assert client.get_run(parent).info.status == client.get_run(killed).info.status == "RUNNING"
    add_loss_run = client.get_run(parent).data.tags["ortflow.run.add_loss"]

    resumed = _train_in_process(compose_pipeline, tmp_path / "resumed", f"mlflow.tracking_uri={uri}",
                                *[o for o in overrides if not o.startswith("stages=")],
                                f"source.run_id={add_loss_run}", f"trainer.resume_from={killed}")
    assert client.get_run(resumed).info.status == "FINISHED"
    for run_id in (killed, parent):
        run = client.get_run(run_id)
        assert run.info.status == "KILLED", run_id
        assert run.data.tags[RESUMED_BY_TAG] == resumed


def test_checkpoints_logged_in_the_background_and_a_torn_copy_falls_back_to_the_backup(
        prepared, compose_pipeline, clean_mlflow_env, tmp_path, regression_data):
    """Logged from the epoch loop or from a thread, each copy is complete; a process killed while logging
    leaves ``checkpoint/`` torn: the complete ``checkpoint_backup/`` is used."""
    from mlflow.utils.file_utils import local_file_uri_to_path
    from sklearn.neural_network import MLPRegressor

    from ortflow import OrtGradientOptimizer, add_loss_output, to_onnx
    from pipelines.tracking.checkpoints import CheckpointError, MlflowCheckpoint, checkpoint_uri, resolve

    folder, uri, _ = prepared
    tracking = prepare(compose_pipeline(f"mlflow.tracking_uri={uri}", f"mlflow.root={folder}",
                                        "mlflow.experiment_name=resume-torn"))
    run_id = tracking.client.create_run(tracking.experiment_id).info.run_id
    X, y = regression_data
    graph = add_loss_output(to_onnx(MLPRegressor(hidden_layer_sizes=(4,), max_iter=1, random_state=0).fit(X, y)))
    in_loop = MlflowCheckpoint(tmp_path / "in-loop", 2, tracking, run_id, background=False)
    OrtGradientOptimizer(graph, max_iter=3, callbacks=[in_loop]).fit(X, y)
    assert in_loop.logged == 2  # epochs 2 and 3 (the last)
    logger = MlflowCheckpoint(tmp_path / "ckpt", 1, tracking, run_id)  # in the background
    OrtGradientOptimizer(graph, max_iter=5, callbacks=[logger]).fit(X, y)
    assert 1 <= logger.logged <= 5 and logger.failures == 0  # a checkpoint still waiting is replaced by the next
    assert not logger.spool.exists()
    artifacts = Path(local_file_uri_to_path(MlflowClient(uri).get_run(run_id).info.artifact_uri))
    primary, backup = artifacts / "checkpoint", artifacts / f"checkpoint{BACKUP_SUFFIX}"
    assert sorted(p.name for p in primary.iterdir()) == sorted(p.name for p in backup.iterdir())

    assert checkpoint_uri(run_id) == checkpoint_uri(f"runs:/{run_id}") == f"runs:/{run_id}/checkpoint"
    point = resolve(tracking, run_id, tmp_path / "intact")  # the last epoch is always logged
    assert (point.source, point.run_id, point.epoch) == (f"runs:/{run_id}/checkpoint", run_id, 5)

    # killed while overwriting the state file of the primary copy: truncated, the manifest is the old one
    state = next(p for p in primary.iterdir() if p.name not in ("trainer.json", MANIFEST))
    state.write_bytes(state.read_bytes()[:10])
    point = resolve(tracking, f"runs:/{run_id}/checkpoint", tmp_path / "torn")
    assert point.source == f"runs:/{run_id}/checkpoint{BACKUP_SUFFIX}" and point.epoch == 5
    assert check_folder(point.folder) == "ok"
    resumed = OrtGradientOptimizer(graph, max_iter=6).fit(X, y, resume_from=point.folder)
    assert [r["epoch"] for r in resumed.history_] == [1, 2, 3, 4, 5, 6]

    (backup / "trainer.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        resolve(tracking, run_id, tmp_path / "both")
    with pytest.raises(CheckpointError, match="no run 0123456789abcdef0123456789abcdef"):
        resolve(tracking, "0123456789abcdef0123456789abcdef", tmp_path / "unknown")


def test_a_logged_checkpoint_without_its_manifest_is_not_trusted(prepared, compose_pipeline, clean_mlflow_env,
                                                                 tmp_path, regression_data):
    from sklearn.linear_model import LinearRegression

    import ortflow
    from ortflow import OrtGradientOptimizer, add_loss_output, to_onnx
    from pipelines.tracking.checkpoints import CheckpointError, resolve

    folder, uri, _ = prepared
    tracking = prepare(compose_pipeline(f"mlflow.tracking_uri={uri}", f"mlflow.root={folder}",
                                        "mlflow.experiment_name=resume-no-manifest"))
    run_id = tracking.client.create_run(tracking.experiment_id).info.run_id
    X, y = regression_data
    OrtGradientOptimizer(add_loss_output(to_onnx(LinearRegression().fit(X, y))), max_iter=2,
                         callbacks=[ortflow.Checkpoint(tmp_path / "ckpt", every=1)]).fit(X, y)
    for slot in ("checkpoint", f"checkpoint{BACKUP_SUFFIX}"):  # complete files, no checkpoint_manifest.json
        tracking.client.log_artifacts(run_id, str(tmp_path / "ckpt"), slot)
    assert resolve(tracking, str(tmp_path / "ckpt"), tmp_path / "local").epoch == 2  # a local folder: the user's
    with pytest.raises(CheckpointError, match="without its checkpoint_manifest.json .* is not trusted"):
        resolve(tracking, run_id, tmp_path / "logged")


def test_a_local_checkpoint_whose_metadata_flipped_a_bit_is_refused_before_a_run_is_tagged(tmp_path,
                                                                                           regression_data):
    """Seen in the library (its trainer.json had no checksum of its own): the pipelines read a local folder's
    epoch from it unverified, to tag the run ``ortflow.resumed_from_epoch``."""
    from sklearn.linear_model import LinearRegression

    from ortflow import OrtGradientOptimizer, add_loss_output, to_onnx
    from pipelines.tracking.checkpoints import CheckpointError, checkpoint_epoch, resolve
    from test_reliability_core import flip_a_bit_in_the_random_state

    X, y = regression_data
    folder = tmp_path / "ckpt"
    OrtGradientOptimizer(add_loss_output(to_onnx(LinearRegression().fit(X, y))), max_iter=2,
                         random_state=0).fit(X, y).save_checkpoint(folder)
    assert checkpoint_epoch(folder) == 2
    flip_a_bit_in_the_random_state(folder / "trainer.json")
    assert checkpoint_epoch(folder) is None
    with pytest.raises(CheckpointError, match=r"trainer\.json does not match its checksum"):
        resolve(None, str(folder), tmp_path / "local")  # a local folder: no tracking store is asked


@pytest.mark.slow
def test_resuming_a_live_run_leaves_it_alone_and_sigterm_ends_it_killed(prepared, compose_pipeline, clean_mlflow_env,
                                                                         tmp_path, pipeline_subprocess_env):
    """A chain whose train run is resumed while its process still trains: the run is not marked KILLED (its
    pid lives). Then SIGTERM (what ``kill``, Slurm and ``docker stop`` send): the train run and the chain's
    parent end KILLED with the signal as the reason, not RUNNING."""
    folder, uri, _ = prepared
    client = MlflowClient(uri)
    experiment_name = "resume-live"
    overrides = ["experiment=smoke", f"mlflow.root={folder}", f"mlflow.experiment_name={experiment_name}",
                 *TRAINERS["full"], "trainer.max_iter=1000000"]
    env = dict(pipeline_subprocess_env, MLFLOW_TRACKING_URI=uri)
    cmd = [sys.executable, "-m", "pipelines.main", *overrides, "stages=[convert,add_loss,train]",
           "trainer.checkpoint_every=100", f"hydra.run.dir={tmp_path / 'live'}"]
    log = tmp_path / "live.log"

    def checkpoint_epoch(run_id):
        try:
            return json.loads(Path(mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=f"checkpoint/{MANIFEST}", tracking_uri=uri)).read_text())["epoch"]
        except Exception:  # noqa: BLE001 - not logged yet, or being rewritten
            return None

    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        live = _wait_for("a train run", lambda: _train_runs(client, experiment_name), proc, log)
        epoch = _wait_for("a logged checkpoint", lambda: checkpoint_epoch(live), proc, log)
        parent = client.get_run(live).data.tags["mlflow.parentRunId"]
        add_loss_run = client.get_run(parent).data.tags["ortflow.run.add_loss"]
        resumed = _train_in_process(compose_pipeline, tmp_path / "resumed", f"mlflow.tracking_uri={uri}",
                                    *overrides, f"source.run_id={add_loss_run}", f"trainer.max_iter={epoch + 50}",
                                    f"trainer.resume_from={live}")
        assert client.get_run(resumed).info.status == "FINISHED"
        assert proc.poll() is None
        for run_id in (live, parent):  # alive: left alone
            run = client.get_run(run_id)
            assert run.info.status == "RUNNING" and RESUMED_BY_TAG not in run.data.tags, run_id
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 143, log.read_text()[-3000:]  # SIGTERM: one line, status 128 + 15
    for run_id in (live, parent):
        run = client.get_run(run_id)
        assert run.info.status == "KILLED", run_id
        assert run.data.tags["ortflow.failure_reason"] == "Terminated: signal SIGTERM received"


@pytest.mark.parametrize("change, seen", [("trainer.optimizer=adam", "trainer.optimizer: sgd -> adam"),
                                          ("trainer=fwbw", "trainer.name: full -> fwbw")])
def test_resuming_into_another_optimizer_or_trainer_is_refused_before_any_stage(
        prepared, compose_pipeline, clean_mlflow_env, tmp_path, change, seen):
    """Issue 41 item 14: ``trainer.optimizer=adam trainer.resume_from=<sgd run>`` ran convert and add_loss, then
    failed in train with a raw KeyError (another trainer: a CheckpointError traceback); now refused before the
    chain's first stage, naming the difference, and a one-line error with a hint on the command line."""
    from mlflow import MlflowClient

    from ortflow.exceptions import CheckpointError
    from pipelines.base.errors import hint_for
    from pipelines.orchestration.chain import run_chain

    folder, uri, add_loss_run = prepared
    base = ["experiment=smoke", f"mlflow.tracking_uri={uri}", f"mlflow.root={folder}",
            "mlflow.experiment_name=resume-other", "trainer=full", "trainer.max_iter=2"]
    source = _train_in_process(compose_pipeline, tmp_path / "sgd", *base, f"source.run_id={add_loss_run}",
                               "trainer.checkpoint_every=1")
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("resume-other").experiment_id
    before = len(client.search_runs([experiment]))
    cfg = compose_pipeline(*base, change, f"trainer.resume_from={source}", f"hydra.run.dir={tmp_path / 'chain'}")
    with pytest.raises(CheckpointError, match=f"run {source} trained with other settings.*{re.escape(seen)}") as info:
        run_chain(cfg, tmp_path / "chain")
    assert len(client.search_runs([experiment])) == before  # no stage ran, no run was made
    assert hint_for(info.value) is not None
