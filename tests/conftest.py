"""Shared fixtures: small data sets (float32), built once per session."""

import numpy as np
import pytest


@pytest.fixture(scope="session")
def regression_data():
    from sklearn.datasets import make_regression

    X, y = make_regression(400, n_features=8, noise=1.0, bias=2.0, random_state=0)
    return X.astype(np.float32), (y / 50).astype(np.float32)


@pytest.fixture(scope="session")
def classification_data():
    from sklearn.datasets import make_classification

    X, y = make_classification(400, n_features=8, n_informative=5, random_state=0)
    return X.astype(np.float32), y.astype(np.int64)


# --- pipelines (tests/test_pipeline*.py): a real MLflow server, sqlite stores, Hydra composition -------------

import os as _os
import signal as _signal
import socket as _socket
import subprocess as _subprocess
import sys as _sys
import time as _time
import urllib.request as _urlrequest
from pathlib import Path as _Path

REPO_ROOT = _Path(__file__).resolve().parent.parent
_MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID",
               "ORTFLOW_SWEEP_RUN_ID")


def _free_port() -> int:
    with _socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` (sqlite backend, served artifacts) on a free port of 127.0.0.1; its URL."""
    folder = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    env = {k: v for k, v in _os.environ.items() if k not in _MLFLOW_ENV}
    cmd = [_sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder / 'server.db'}",
           "--artifacts-destination", str(folder / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1"]
    log = open(folder / "server.log", "w")
    proc = _subprocess.Popen(cmd, cwd=folder, env=env, stdout=log, stderr=_subprocess.STDOUT,
                             start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = _time.monotonic() + 90
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited ({proc.returncode}): {(folder / 'server.log').read_text()}")
            try:
                with _urlrequest.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if _time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server not ready after 90 s: {(folder / 'server.log').read_text()}")
            _time.sleep(0.3)
        yield url
    finally:
        # the server forks uvicorn workers: stop the whole process group
        try:
            _os.killpg(proc.pid, _signal.SIGTERM)
            proc.wait(timeout=3)
        except ProcessLookupError:
            pass
        except _subprocess.TimeoutExpired:  # uvicorn may wait for idle keep-alive connections
            _os.killpg(proc.pid, _signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


@pytest.fixture
def clean_mlflow_env(monkeypatch):
    """No MLFLOW_* variable of the caller's shell leaks into a pipeline test; no run stays active after it."""
    for name in _MLFLOW_ENV:
        monkeypatch.delenv(name, raising=False)
    yield
    import mlflow

    while mlflow.active_run() is not None:
        mlflow.end_run()


@pytest.fixture
def sqlite_uri(tmp_path):
    """A fresh embedded tracking store for one test."""
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def compose_pipeline():
    """Compose the pipelines' Hydra config (conf/config.yaml) with overrides, as the CLI would."""
    from hydra import compose, initialize_config_dir

    from pipelines.config import register_configs

    register_configs()

    def _compose(*overrides: str):
        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
            return compose("config", overrides=list(overrides))

    return _compose


@pytest.fixture
def pipeline_subprocess_env():
    """Environment for ``python -m pipelines.*`` run from a temporary folder."""
    env = {k: v for k, v in _os.environ.items() if k not in _MLFLOW_ENV}
    env["PYTHONPATH"] = str(REPO_ROOT) + _os.pathsep + env.get("PYTHONPATH", "")
    # `mlflow run` starts `python -m ...`: the interpreter running the tests (the venv's) must come first
    env["PATH"] = str(_Path(_sys.executable).parent) + _os.pathsep + env.get("PATH", "")
    return env
