"""Shared fixtures: small data sets (float32), built once per session."""

import numpy as np
import pytest


#: session-wide servers and clusters: under pytest-xdist (``make test`` runs ``-n``), the tests that use one run in
#: one worker (``--dist loadgroup``), so each is started once, not once per worker
SHARED_SERVERS = {"postgres_server": "cluster", "ray_cluster": "cluster", "mlflow_server": "mlflow_server"}


def cuda_unavailable() -> str | None:
    """Why the ``gpu`` tests cannot run here (no CUDA provider in this onnxruntime, or it does not load: no GPU,
    driver or CUDA libraries), or None when a session runs on CUDA."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"needs onnxruntime's CUDA provider ({ort.__version__} has {ort.get_available_providers()})"
    from onnx import TensorProto, helper

    from ortflow.runtime.sessions import make_session

    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [value],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    try:
        make_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), "cuda")
    except Exception as exc:  # noqa: BLE001 - DeviceError (the provider fell back to the CPU) or onnxruntime's own
        return f"needs a GPU: {str(exc)[:300]}"
    return None


def pytest_collection_modifyitems(config, items):
    """Tests marked ``training_build`` (onnxruntime's own gradients, TrainingAgent, generate_artifacts) are skipped
    where the plain onnxruntime is installed, tests marked ``gpu`` where no session runs on CUDA; the tests of a
    shared server share an xdist group."""
    from ortflow import backend

    for item in items:
        groups = {SHARED_SERVERS[f] for f in getattr(item, "fixturenames", ()) if f in SHARED_SERVERS}
        if groups:
            item.add_marker(pytest.mark.xdist_group(sorted(groups)[0]))
    if any("gpu" in item.keywords for item in items):
        reason = cuda_unavailable()
        if reason:
            for item in items:
                if "gpu" in item.keywords:
                    item.add_marker(pytest.mark.skip(reason=reason))
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


@pytest.fixture
def two_output_graph():
    """a (N,3), b (N,2) -> y = relu(a @ W + c) * b @ V (N,1), z = a @ W + frozen (N,2), idx = argmax(z) (int64):
    two inputs, two float outputs and one without gradient, initializers W, c, V and frozen."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name) for name, shape in
             (("layer.0/W", (3, 2)), ("c", (2,)), ("V", (2, 1)), ("frozen", (2,)))]
    nodes = [
        helper.make_node("MatMul", ["a", "layer.0/W"], ["aw"]),
        helper.make_node("Add", ["aw", "c"], ["pre"]),
        helper.make_node("Relu", ["pre"], ["h"]),
        helper.make_node("Mul", ["h", "b"], ["hb"]),
        helper.make_node("MatMul", ["hb", "V"], ["y"]),
        helper.make_node("Add", ["aw", "frozen"], ["z"]),
        helper.make_node("ArgMax", ["z"], ["idx"], axis=1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "two", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [None, 3]),
                       helper.make_tensor_value_info("b", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 2]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, [None])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


# --- pipelines (tests/test_pipeline*.py): a real MLflow server, sqlite stores, Hydra composition -------------

import contextlib
import os as _os
import sys as _sys
from pathlib import Path as _Path

from pipelines.server import MlflowServer as _ServerProcess

REPO_ROOT = _Path(__file__).resolve().parent.parent
_MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID",
               "ORTFLOW_SWEEP_RUN_ID")


class MlflowServer(_ServerProcess):
    """A real ``mlflow server`` process (sqlite backend, served artifacts) on 127.0.0.1 that a test can stop and
    start again on the same port and store."""

    def __init__(self, folder: _Path, port: int | None = None):
        super().__init__(folder, f"sqlite:///{folder / 'server.db'}", port, workers=1)

    def log_text(self) -> str:
        return self.log.read_text()


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
    """No MLFLOW_* variable of the caller's shell leaks into a pipeline test, nor one the test's MLflow calls set
    (``mlflow.set_tracking_uri``/``set_experiment`` write them for subprocesses) into the tests after it; no run
    stays active after it."""
    for name in _MLFLOW_ENV:
        monkeypatch.delenv(name, raising=False)
    yield
    import mlflow

    while mlflow.active_run() is not None:
        mlflow.end_run()
    for name in _MLFLOW_ENV:  # then monkeypatch puts back what the shell had
        _os.environ.pop(name, None)


@pytest.fixture(scope="session")
def new_sqlite_store(tmp_path_factory):
    """``new_sqlite_store(path) -> uri``: a new, empty MLflow sqlite store at ``path`` (its folder made), as MLflow
    leaves one it has just created (pipelines.tracking.store.create_store_once: the tracking and registry tables)
    but for the Default experiment, which MLflow adds with this store's artifact root when it first opens it.

    MLflow's schema migrations take 5-12 s per new store on 2 busy cores; they run once per session, into a
    template that each store copies. The tests of creating a store (racing processes on a new one,
    tests/test_scale_sqlite.py) keep a path where nothing exists."""
    import shutil
    import sqlite3

    from mlflow import MlflowClient

    template = tmp_path_factory.mktemp("sqlite-template") / "mlflow.db"
    uri = f"sqlite:///{template}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.search_experiments(max_results=1)
    client.search_registered_models(max_results=1)
    with contextlib.closing(sqlite3.connect(template)) as db, db:
        db.execute("DELETE FROM experiments WHERE experiment_id = 0")  # made again by the store that opens a copy

    def make(path) -> str:
        path = _Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, path)
        return f"sqlite:///{path}"

    return make


@pytest.fixture
def sqlite_uri(tmp_path, new_sqlite_store):
    """A new embedded tracking store for one test (``tmp_path/mlflow.db``)."""
    return new_sqlite_store(tmp_path / "mlflow.db")


@pytest.fixture
def compose_pipeline():
    """Compose the pipelines' Hydra config (conf/config.yaml) with overrides, as the CLI would (``model`` and
    ``loss`` left unchosen get the options of ``data.task``, as the entry points give them)."""
    from hydra import compose, initialize_config_dir

    from pipelines.base.resolvers import register_configs

    from pipelines.base.schema import follow_task

    register_configs()

    def _compose(*overrides: str):
        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=list(overrides))
        follow_task(cfg)
        return cfg

    return _compose


@pytest.fixture(scope="session")
def run_chain_clean():
    """``run_chain_clean(overrides, work_dir) -> ChainResult``: the chain composed from conf/ and run in this
    process with no MLFLOW_* variable of the caller's shell in the way and no run left active; for module-scoped
    fixtures, which cannot use ``clean_mlflow_env``."""
    import mlflow
    from hydra import compose, initialize_config_dir

    from pipelines.base.resolvers import register_configs
    from pipelines.orchestration.chain import run_chain

    register_configs()

    def run(overrides, work_dir):
        with pytest.MonkeyPatch.context() as patch:
            for name in _MLFLOW_ENV:
                patch.delenv(name, raising=False)
            with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
                cfg = compose("config", overrides=list(overrides))
            result = run_chain(cfg, work_dir=work_dir)
            while mlflow.active_run() is not None:
                mlflow.end_run()
        return result

    return run


@pytest.fixture
def pipeline_subprocess_env():
    """Environment for ``python -m pipelines.*`` run from a temporary folder."""
    env = {k: v for k, v in _os.environ.items() if k not in _MLFLOW_ENV}
    env["PYTHONPATH"] = str(REPO_ROOT) + _os.pathsep + env.get("PYTHONPATH", "")
    # `mlflow run` starts `python -m ...`: the interpreter running the tests (the venv's) must come first
    env["PATH"] = str(_Path(_sys.executable).parent) + _os.pathsep + env.get("PATH", "")
    return env


# --- scale-out (tests/test_scale_*.py): a throwaway PostgreSQL cluster with an mlflow server on it -------------


@pytest.fixture(scope="session")
def postgres_server():
    """A :class:`pipelines.server.TeamServer` started as users start it, ``python -m pipelines.server`` (what
    ``make server`` runs): PostgreSQL in a temporary folder on a free port and ``mlflow server`` on it (proxied
    artifacts); stopped with SIGTERM at the end of the session (both servers), the folder removed.

    The folder is made with ``tempfile.mkdtemp`` under /tmp rather than pytest's tmp_path, whose root-only parent
    the ``postgres`` user cannot enter."""
    import shutil
    import signal
    import subprocess
    import tempfile

    from pipelines.server import TeamServer, free_port, wait_ready

    folder = _Path(tempfile.mkdtemp(prefix="ortflow-pg-"))
    server = TeamServer(folder, free_port(), free_port())  # the ports the command is given
    log = open(folder.parent / f"{folder.name}.log", "w")
    cmd = [_sys.executable, "-m", "pipelines.server", "--folder", str(folder), "--port", str(server.mlflow.port),
           "--pg-port", str(server.postgres.port)]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(proc, f"{server.url}/health", 240, folder.parent / f"{folder.name}.log", "pipelines.server",
                   interval=0.5)
        yield server
    finally:
        proc.send_signal(signal.SIGTERM)  # the command stops mlflow server and PostgreSQL, then exits
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            server.postgres.stop()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)
        (folder.parent / f"{folder.name}.log").unlink(missing_ok=True)
