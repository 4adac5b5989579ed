"""Tracking failures, injected for real: a server that is not there, a server stopped (and restarted) in the
middle of training, a sweep in which one job diverges."""

import functools
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from mlflow import MlflowClient

import ortflow
from pipelines.execution.bundle import Bundle
from pipelines.orchestration.chain import run_chain
from pipelines.execution.runner import execute_stage, prepare
from pipelines.stages.train import train
from pipelines.tracking import TrackingUnavailableError, resend

REPO = Path(__file__).resolve().parent.parent
EPOCHS = 12


class AtEpoch(ortflow.Callback):
    """Runs ``action`` once, after epoch ``epoch``: how these tests stop or start a server mid-training."""

    def __init__(self, epoch: int, action):
        self.epoch, self.action = epoch, action

    def on_epoch_end(self, trainer, record):
        if record["epoch"] == self.epoch:
            self.action()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_server_fails_at_once_naming_the_uri(tmp_path, pipeline_subprocess_env):
    uri = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    env = dict(pipeline_subprocess_env, MLFLOW_TRACKING_URI=uri)
    begin = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pipelines.main", "experiment=smoke", "hydra.run.dir=out"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - begin
    assert proc.returncode == 2  # an expected error: one line and a hint (pipelines.base.errors)
    assert proc.stderr.startswith("ortflow: error: TrackingUnavailableError: ") and uri in proc.stderr, proc.stderr
    assert "nothing was run" in proc.stderr
    assert not (tmp_path / "out" / "convert").exists() and not (tmp_path / "out" / "train").exists()
    print(f"failed after {seconds:.1f} s")  # recorded in docs/RELIABILITY.md, not asserted


def _prepared_run(compose_pipeline, tmp_path, url, *overrides):
    """An add_loss run on the server, and the config of a train stage that starts from it."""
    base = ("experiment=smoke", f"mlflow.tracking_uri={url}", f"mlflow.root={tmp_path}",
            "mlflow.experiment_name=outage")
    first = run_chain(compose_pipeline(*base, "stages=[convert,add_loss]"), work_dir=tmp_path / "first")
    cfg = compose_pipeline(*base, f"source.run_id={first.run_id}", f"trainer.max_iter={EPOCHS}",
                           "mlflow.metrics_flush_every=1", *overrides)
    return cfg


def _train_stage(cfg, work_dir, *callbacks):
    tracking = prepare(cfg)
    return execute_stage("train", functools.partial(train, callbacks=list(callbacks)), cfg, tracking,
                         Bundle.from_source(cfg.source), work_dir)


def _steps(client, run_id, key):
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def test_server_stopped_and_restarted_mid_training_loses_nothing(compose_pipeline, clean_mlflow_env, tmp_path,
                                                                 own_mlflow_server):
    server = own_mlflow_server
    cfg = _prepared_run(compose_pipeline, tmp_path, server.url)
    # down from the end of epoch 3 to the end of epoch 8: five epochs of metrics are written while it is away
    result = _train_stage(cfg, tmp_path / "train", AtEpoch(3, server.stop), AtEpoch(8, server.start))
    client = MlflowClient(server.url)
    run = client.get_run(result["run_id"])
    assert run.info.status == "FINISHED"
    for key in ("train_loss", "validation_loss", "epoch_time_seconds"):
        assert _steps(client, run.info.run_id, key) == list(range(1, EPOCHS + 1)), key
    graphs = {Path(f.path).name for f in client.list_artifacts(run.info.run_id, "graphs")}
    assert "trained_model.onnx" in graphs
    assert run.data.metrics["n_epochs"] == EPOCHS


def test_server_lost_for_good_keeps_outputs_locally_and_says_where(compose_pipeline, clean_mlflow_env, tmp_path,
                                                                   own_mlflow_server):
    server = own_mlflow_server
    cfg = _prepared_run(compose_pipeline, tmp_path, server.url, "trainer=fwbw", "mlflow.retry_seconds=2")
    work = tmp_path / "train"
    with pytest.raises(TrackingUnavailableError) as info:
        _train_stage(cfg, work, AtEpoch(3, server.stop))
    message = str(info.value)
    assert server.url in message and "Training finished and nothing is lost" in message
    assert str(work / "graphs") in message and str(work / "unsent_metrics.json") in message

    # everything is on local disk: the trained model runs, the history has every epoch
    model = work / "graphs" / "trained_model.onnx"
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    X = np.zeros((2, session.get_inputs()[0].shape[1]), dtype=np.float32)
    assert np.isfinite(session.run(None, {session.get_inputs()[0].name: X})[0]).all()
    history = json.loads((work / "history.json").read_text())
    assert [r["epoch"] for r in history] == list(range(1, EPOCHS + 1))
    spooled = json.loads((work / "unsent_metrics.json").read_text())
    unsent_steps = sorted({step for key, _, _, step in spooled["metrics"] if key == "train_loss"})
    assert unsent_steps and unsent_steps[-1] == EPOCHS  # at least the epochs after the stop

    # the store comes back: the spooled metrics complete the curves, and the run ends FAILED with the reason
    server.start()
    assert resend(work / "unsent_metrics.json") == len(spooled["metrics"])
    client = MlflowClient(server.url)
    run = client.get_run(spooled["run_id"])
    assert _steps(client, run.info.run_id, "train_loss") == list(range(1, EPOCHS + 1))
    assert run.info.status == "FAILED"
    assert "stopped answering" in run.data.tags["ortflow.failure_reason"]


@pytest.mark.slow
def test_sweep_with_a_diverging_job_completes_the_others(tmp_path, pipeline_subprocess_env, new_sqlite_store):
    uri = new_sqlite_store(tmp_path / "mlflow.db")
    env = dict(pipeline_subprocess_env, MLFLOW_TRACKING_URI=uri)
    cmd = [sys.executable, "-m", "pipelines.main", "-m", "experiment=smoke", "trainer.batch_size=8",
           "trainer.learning_rate=0.01,1e4,0.02", f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("ortflow").experiment_id])
    sweep = [r for r in runs if r.data.tags.get("ortflow.sweep") == "true"]
    assert len(sweep) == 1
    jobs = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == sweep[0].info.run_id]
    by_lr = {r.data.params["trainer.learning_rate"]: r for r in jobs}
    assert sorted(by_lr) == ["0.01", "0.02", "10000.0"]
    assert by_lr["0.01"].info.status == by_lr["0.02"].info.status == "FINISHED"
    failed = by_lr["10000.0"]
    assert failed.info.status == "FAILED" and "ConvergenceError" in failed.data.tags["ortflow.failure_reason"]
    sweep_run = client.get_run(sweep[0].info.run_id)
    assert sweep_run.info.status == "FINISHED"
    assert sweep_run.data.metrics["jobs_failed"] == 1 and sweep_run.data.metrics["jobs_finished"] == 2
    # nothing from the diverged job reached the registry: the sweep registered its best finished trial, once
    versions = client.search_model_versions("name='ortflow-smoke-regression-mlp_regressor'")
    assert {v.run_id for v in versions} <= {r.info.run_id for r in runs if r.info.status == "FINISHED"}
    assert len(versions) == 1
