"""Shared fixtures: small data sets (float32), built once per session."""

import numpy as np
import pytest


def pytest_collection_modifyitems(config, items):
    """Tests marked ``training_build`` (onnxruntime's own gradients, TrainingAgent, generate_artifacts) are skipped
    where the plain onnxruntime is installed."""
    from ortflow import backend

    if backend() == "training":
        return
    skip = pytest.mark.skip(reason="needs onnxruntime-training; the plain onnxruntime is installed")
    for item in items:
        if "training_build" in item.keywords:
            item.add_marker(skip)


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


@pytest.fixture
def model_with_outside_data(tmp_path, regression_data):
    """A folder holding ``model.onnx`` whose first initializer's external data is ``../secret.bin``."""
    import onnx
    from sklearn.linear_model import LinearRegression

    from ortflow import to_onnx

    onx = to_onnx(LinearRegression().fit(*regression_data))
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64)
    coef = onx.graph.initializer[0]
    coef.ClearField("raw_data")
    coef.data_location = onnx.TensorProto.EXTERNAL
    entry = coef.external_data.add()
    entry.key, entry.value = "location", "../secret.bin"
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save(onx, str(folder / "model.onnx"))
    return folder


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


class MlflowServer:
    """A real ``mlflow server`` process (sqlite backend, served artifacts) on 127.0.0.1 that a test can stop and
    start again on the same port and store."""

    def __init__(self, folder: _Path, port: int | None = None):
        self.folder = folder
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self._log = None

    def start(self, timeout: float = 90) -> None:
        env = {k: v for k, v in _os.environ.items() if k not in _MLFLOW_ENV}
        cmd = [_sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
               f"sqlite:///{self.folder / 'server.db'}", "--artifacts-destination", str(self.folder / "artifacts"),
               "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        self._log = open(self.folder / "server.log", "a")
        self.proc = _subprocess.Popen(cmd, cwd=self.folder, env=env, stdout=self._log, stderr=_subprocess.STDOUT,
                                      start_new_session=True)
        deadline = _time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited ({self.proc.returncode}): {self.log_text()}")
            try:
                with _urlrequest.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if _time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mlflow server not ready after {timeout} s: {self.log_text()}")
            _time.sleep(0.3)

    def stop(self) -> None:
        """Stop the whole process group (the server forks uvicorn workers)."""
        if self.proc is None:
            return
        try:
            _os.killpg(self.proc.pid, _signal.SIGTERM)
            self.proc.wait(timeout=3)
        except ProcessLookupError:
            pass
        except _subprocess.TimeoutExpired:  # uvicorn may wait for idle keep-alive connections
            _os.killpg(self.proc.pid, _signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None
        self._log.close()

    def log_text(self) -> str:
        return (self.folder / "server.log").read_text()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """The URL of a real ``mlflow server`` shared by the tests that only use it."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def own_mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` of this test alone, which the test may stop and start (a :class:`MlflowServer`)."""
    server = MlflowServer(tmp_path_factory.mktemp("own-mlflow-server"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


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
