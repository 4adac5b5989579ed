"""Faults of the second reliability round (issue 17), injected for real: a dead or hanging tracking server,
experiment names that look like paths, data that overflows float32, signals, a run resumed while alive."""

import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.utils.file_utils import local_file_uri_to_path

from pipelines import tracking as tr

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_resend_to_a_dead_server_fails_within_the_connect_timeout(tmp_path, pipeline_subprocess_env):
    uri = f"http://127.0.0.1:{_free_port()}"  # nobody listens
    spool = tmp_path / "unsent_metrics.json"
    spool.write_text(json.dumps({"tracking_uri": uri, "run_id": "0" * 32, "failure_reason": "lost",
                                 "metrics": [["train_loss", 1.0, 0, 1]]}))
    proc = subprocess.run([sys.executable, "-m", "pipelines.resend", str(spool)], cwd=tmp_path,
                          env=pipeline_subprocess_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert f"nothing sent: the MLflow tracking server {uri} is unreachable" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


class _HealthOnly(http.server.BaseHTTPRequestHandler):
    """Answers /health, then hangs on every other request until the test ends (a store that is stuck)."""

    release = threading.Event()

    def do_GET(self):  # noqa: N802 - http.server's naming
        if self.path == "/health":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")
            return
        self.release.wait(120)

    do_POST = do_GET

    def log_message(self, *args):
        pass


def test_server_answering_health_but_hanging_fails_at_start(tmp_path, pipeline_subprocess_env):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HealthOnly)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        env = dict(pipeline_subprocess_env, MLFLOW_TRACKING_URI=uri)
        proc = subprocess.run([sys.executable, "-m", "pipelines.convert", "experiment=smoke", "hydra.run.dir=out"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    finally:
        _HealthOnly.release.set()
        server.shutdown()
        server.server_close()
    assert proc.returncode != 0
    assert f"the MLflow tracking server {uri} is not answering its REST API" in proc.stderr, proc.stderr[-2000:]
    assert "timed out" in proc.stderr and "nothing was run" in proc.stderr
    assert not (tmp_path / "out" / "convert").exists()


def test_experiment_names_never_put_artifacts_outside_the_artifact_folder(compose_pipeline, clean_mlflow_env,
                                                                          tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "file.txt").write_text("x")
    artifacts = (tmp_path / "mlartifacts").resolve()
    for name in ("..", ".", "../outside", "/tmp/abs", "a/../../b", "..hidden"):
        monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)  # mlflow.set_experiment sets it
        tracking = tr.setup(compose_pipeline(f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path}",
                                             f"mlflow.experiment_name='{name}'"))
        assert tracking.experiment_name == name
        run_id = tracking.client.create_run(tracking.experiment_id).info.run_id
        tr.log_artifact(tracking, run_id, tmp_path / "file.txt", "sub")
        stored = Path(local_file_uri_to_path(MlflowClient(uri).get_run(run_id).info.artifact_uri)) / "sub"
        assert (stored / "file.txt").is_file()
        assert stored.resolve().is_relative_to(artifacts), (name, stored)
        assert not stored.resolve().relative_to(artifacts).parts[0].startswith("."), (name, stored)


def test_a_feature_beyond_float32_fails_the_run_and_registers_nothing(compose_pipeline, clean_mlflow_env, tmp_path):
    """One CSV value of 1e200 (finite in float64): the float32 deploy graph predicts NaN. Evaluate runs it on the
    test split before anything is registered: the chain ends FAILED with the reason, the registry stays empty."""
    import pandas as pd
    from sklearn.datasets import make_regression

    from pipelines.chain import run_chain
    from pipelines.stages.evaluate import NonFinitePredictionError

    X, y = make_regression(120, n_features=3, noise=1.0, random_state=0)
    frame = pd.DataFrame(X, columns=["a", "b", "c"]).assign(target=y)
    frame.loc[7, "b"] = 1e200
    frame.to_csv(tmp_path / "table.csv", index=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = compose_pipeline("data=file", f"data.path={tmp_path / 'table.csv'}", "data.target=target", "model=linear",
                           "trainer.max_iter=2", f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path}")
    with pytest.raises(NonFinitePredictionError, match=r"non-finite values on \d+ of \d+ test rows .* features "
                                                       r"\['b'\] overflows .*: it is not registered"):
        run_chain(cfg, work_dir=tmp_path / "chain")
    client = MlflowClient(uri)
    runs = {r.data.tags.get("ortflow.stage", "parent"): r for r in client.search_runs(
        [client.get_experiment_by_name("ortflow").experiment_id])}
    assert sorted(runs) == ["add_loss", "convert", "evaluate", "parent", "train"]  # export never ran
    for stage in ("evaluate", "parent"):
        assert runs[stage].info.status == "FAILED"
        assert "NonFinitePredictionError" in runs[stage].data.tags[tr.FAILURE_TAG]
    assert client.search_registered_models() == []
