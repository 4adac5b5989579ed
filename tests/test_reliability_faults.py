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

@pytest.fixture(scope="module")
def store_uri(tmp_path_factory, new_sqlite_store):
    """One sqlite store for the module (conftest.new_sqlite_store); each test has its experiments."""
    return new_sqlite_store(tmp_path_factory.mktemp("faults") / "mlflow.db")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_resend_to_a_dead_server_fails_within_the_connect_timeout(tmp_path, capsys):
    from pipelines.resend import main as resend_main

    uri = f"http://127.0.0.1:{_free_port()}"  # nobody listens
    spool = tmp_path / "unsent_metrics.json"
    spool.write_text(json.dumps({"tracking_uri": uri, "run_id": "0" * 32, "failure_reason": "lost",
                                 "metrics": [["train_loss", 1.0, 0, 1]]}))
    assert resend_main([str(spool)]) == 1  # `python -m pipelines.resend FILE`
    err = capsys.readouterr().err
    assert f"nothing sent: the MLflow tracking server {uri} is unreachable" in err and "timeout 5 s" in err, err


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


def test_server_answering_health_but_hanging_fails_at_start(compose_pipeline, clean_mlflow_env, tmp_path):
    from pipelines.execution.runner import prepare

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HealthOnly)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(tr.TrackingUnavailableError) as info:
            prepare(compose_pipeline("experiment=smoke", f"mlflow.tracking_uri={uri}", "mlflow.connect_timeout=2"))
    finally:
        _HealthOnly.release.set()
        server.shutdown()
        server.server_close()
    message = str(info.value)
    assert f"the MLflow tracking server {uri} is not answering its REST API" in message
    assert "timed out" in message and "timeout 2 s" in message and "nothing was run" in message


def test_experiment_names_never_put_artifacts_outside_the_artifact_folder(compose_pipeline, clean_mlflow_env,
                                                                          tmp_path, monkeypatch, store_uri):
    uri = store_uri
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


def test_a_feature_beyond_float32_fails_the_run_and_registers_nothing(compose_pipeline, clean_mlflow_env, tmp_path,
                                                                      store_uri):
    """One CSV value of 1e200 (finite in float64): the float32 deploy graph predicts NaN. Evaluate runs it on the
    test split before anything is registered: the chain ends FAILED with the reason, the registry stays empty."""
    import pandas as pd
    from sklearn.datasets import make_regression

    from pipelines.orchestration.chain import run_chain
    from pipelines.modeling.predictions import NonFinitePredictionError

    X, y = make_regression(120, n_features=3, noise=1.0, random_state=0)
    frame = pd.DataFrame(X, columns=["a", "b", "c"]).assign(target=y)
    frame.loc[7, "b"] = 1e200
    frame.to_csv(tmp_path / "table.csv", index=False)
    uri = store_uri
    cfg = compose_pipeline("data=file", f"data.path={tmp_path / 'table.csv'}", "data.target=target", "model=linear",
                           "trainer.max_iter=2", f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path}",
                           "mlflow.experiment_name=float32",
                           "preprocess=none")  # the numbers path (preprocess=auto refuses the value when reading)
    with pytest.raises(NonFinitePredictionError, match=r"non-finite values on \d+ of \d+ test rows .* features "
                                                       r"\['b'\] overflows .*: it is not registered"):
        run_chain(cfg, work_dir=tmp_path / "chain")
    client = MlflowClient(uri)
    runs = {r.data.tags.get("ortflow.stage", "parent"): r for r in client.search_runs(
        [client.get_experiment_by_name("float32").experiment_id])}
    assert sorted(runs) == ["add_loss", "convert", "evaluate", "parent", "train"]  # export never ran
    for stage in ("evaluate", "parent"):
        assert runs[stage].info.status == "FAILED"
        assert "NonFinitePredictionError" in runs[stage].data.tags[tr.FAILURE_TAG]
    assert client.search_registered_models() == []


def test_training_settings_the_data_or_graph_refuse_fail_before_the_first_stage(compose_pipeline, clean_mlflow_env,
                                                                                tmp_path, store_uri):
    from pipelines.orchestration.chain import run_chain
    from pipelines.base.schema import ConfigError

    uri = store_uri
    base = ("experiment=smoke", f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path}",
            "mlflow.experiment_name=precheck")
    cases = [(("trainer.weights_to_train=[coef_0,nope]",), r"trainer.weights_to_train names unknown initializers "
                                                           r"\['nope'\] \(nothing matches\); the graph has "
                                                           r"\['coef_0', 'coef_1'"),
             (("trainer=fwbw", "trainer.weights_to_train=[loss_l2]"), r"unknown initializers \['loss_l2'\]")]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message):
            run_chain(compose_pipeline(*base, *overrides), work_dir=tmp_path / "chain")
    client = MlflowClient(uri)
    assert client.search_runs([client.get_experiment_by_name("precheck").experiment_id]) == []
    assert not (tmp_path / "chain").exists()


def test_liveness_of_a_run_from_its_pid_here_and_its_heartbeat_elsewhere(store_uri, tmp_path):
    """What :func:`mark_resumed` asks before ending a RUNNING run as KILLED."""
    client = MlflowClient(store_uri)
    experiment = client.create_experiment("liveness", artifact_location=(tmp_path / "a").as_uri())
    here = tr.process_tags()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    beat = float(here[tr.HEARTBEAT_TAG])
    cases = {
        "this process": (here, True),
        "a process that exited": ({**here, tr.PID_TAG: dead.stdout.strip()}, False),
        "this pid, another start time (pid reused)": ({**here, tr.PID_START_TAG: "1"}, False),
        "another host, recent heartbeat": ({**here, tr.HOST_TAG: "elsewhere"}, True),
        "another host, heartbeat 3 beats old": ({**here, tr.HOST_TAG: "elsewhere",
                                                 tr.HEARTBEAT_TAG: str(beat - 3 * tr.HEARTBEAT_SECONDS - 5)}, False),
        "no process tags (written before them)": ({}, False),
    }
    for what, (tags, alive) in cases.items():
        run = client.get_run(client.create_run(experiment, tags=tags).info.run_id)
        assert tr.is_alive(run) is alive, what
