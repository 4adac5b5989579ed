"""Where runs go: the tracking store and experiment (:func:`setup` gives the :class:`Tracking` connection).

Defaults: an embedded sqlite store ``sqlite:///<root>/mlflow.db`` with artifacts under ``<root>/mlartifacts``,
``<root>`` being the directory the command started from (``hydra.job.chdir`` is false). ``MLFLOW_TRACKING_URI``,
``MLFLOW_EXPERIMENT_NAME``/``MLFLOW_EXPERIMENT_ID`` and ``MLFLOW_RUN_ID`` (set by ``mlflow run``) win over the config.
A tracking server is asked for its ``/health`` before anything runs (:func:`check_reachable`).
"""

from __future__ import annotations

import contextlib

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from omegaconf import DictConfig

from ortflow.graph.editing import safe_join

from ..base.errors import TrackingUnavailableError
from ..base.interrupts import PAUSE_ENV, pause_point
from ..base.paths import original_cwd
from .locks import file_lock, lock_path, sqlite_path
from .retries import RetryingClient, call


@dataclass
class Tracking:
    """A configured connection to one tracking store and experiment."""

    uri: str
    client: RetryingClient
    experiment_id: str
    experiment_name: str
    root: Path
    retries: int
    retry_seconds: float = 60.0

    def call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` with this store's retry policy (see :func:`call`)."""
        return call(fn, *args, retries=self.retries, retry_seconds=self.retry_seconds, **kwargs)

    @property
    def is_local_sqlite(self) -> bool:
        return self.uri.startswith("sqlite:")

    def ui_hint(self, run_id: str | None = None) -> str:
        """How to look at the results."""
        if self.uri.startswith(("http://", "https://")):
            path = f"#/experiments/{self.experiment_id}" + (f"/runs/{run_id}" if run_id else "")
            return f"open {self.uri.rstrip('/')}/{path}"
        return f"{mlflow_command()} ui --backend-store-uri {self.uri} --port 5000   # then open http://127.0.0.1:5000"


def mlflow_command() -> str:
    """How a shell runs this environment's ``mlflow``: ``mlflow`` when the PATH finds it (an activated
    environment), else its path (``make run`` does not activate ``.venv``, nor does a new shell)."""
    import shutil
    import sys

    own = Path(sys.executable).parent / "mlflow"
    found = shutil.which("mlflow")
    if found and own.exists() and Path(found).resolve() == own.resolve():
        return "mlflow"
    if not own.exists():
        return f"{sys.executable} -m mlflow"
    with contextlib.suppress(ValueError):  # inside the folder the command runs from: the short path
        return str(own.relative_to(Path.cwd()))
    return str(own)


def resolve_root(cfg: DictConfig) -> Path:
    root = cfg.mlflow.root
    return Path(root).expanduser().resolve() if root else original_cwd()


def resolve_tracking_uri(cfg: DictConfig) -> str:
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    if cfg.mlflow.tracking_uri:
        return str(cfg.mlflow.tracking_uri)
    return f"sqlite:///{resolve_root(cfg) / 'mlflow.db'}"


def _artifact_location(cfg: DictConfig, uri: str, experiment_name: str) -> str | None:
    """Where a new experiment keeps artifacts: <root>/mlartifacts/<name> for local stores; the server decides else."""
    if cfg.mlflow.artifact_root:
        base = Path(cfg.mlflow.artifact_root).expanduser()
        base = base if base.is_absolute() else resolve_root(cfg) / base
    elif uri.startswith(("sqlite:", "file:")) or "://" not in uri:
        base = resolve_root(cfg) / "mlartifacts"
    else:
        return None
    return safe_join(base, artifact_folder_name(experiment_name)).as_uri()


def artifact_folder_name(experiment_name: str) -> str:
    """The folder an experiment's artifacts go to: ``[A-Za-z0-9._-]`` only, never ``.``, ``..`` or hidden
    (``..`` and ``../x`` became folders outside the artifact root)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in experiment_name).lstrip(".")
    return safe or "experiment"


# MLflow's own HTTP retries (7, doubling from 2 s) would hold a call for minutes while a server is down, and its
# 120 s read timeout a call to a server that accepts connections but never answers: keep both short (one call
# gives up after 3 tries of at most 10 s) and let `call` wait, within mlflow.retry_seconds. Variables the user
# set win.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
# a cheap call of the REST API itself: a server may answer /health while its store hangs
_API_PROBE = "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default"


def check_reachable(uri: str, timeout: float) -> None:
    """Raise :class:`TrackingUnavailableError` unless the tracking server at ``uri`` answers ``/health`` and a
    call of its REST API (any HTTP answer, a 404 included), each within ``timeout`` seconds. Sets MLflow's HTTP
    timeouts and retries (:data:`HTTP_DEFAULTS`) unless the environment sets them."""
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    for path, what in (("/health", "unreachable"), (_API_PROBE, "not answering its REST API")):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}{path}", timeout=timeout) as response:
                if response.status == 200:
                    continue
                problem = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            if path == _API_PROBE and exc.code < 500:  # an answer (404: no experiment 'Default')
                continue
            problem = f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            problem = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
        raise TrackingUnavailableError(
            f"the MLflow tracking server {uri} is {what} ({path.split('?')[0]}: {problem}; timeout {timeout:g} s): "
            "nothing was run. Start the server, fix MLFLOW_TRACKING_URI / mlflow.tracking_uri, or unset both to "
            "use the embedded sqlite store")


def create_store_once(uri: str) -> None:
    """Create MLflow's tables of a local sqlite store before any run, one process at a time.

    Seen: two chains started together on a new ``mlflow.db`` both found no tables and both ran the schema
    migrations ("table ... already exists", "No such constraint", CircularDependencyError). Under a file lock next
    to the database, the first process creates the tracking and registry tables; the others then find them.
    Other stores (a server, PostgreSQL behind it) create their schema once when they start.
    """
    db = sqlite_path(uri)
    if db is None:
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(lock_path(db, "schema")):
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.search_experiments(max_results=1)  # the tracking and the registry stores create missing tables
        client.search_registered_models(max_results=1)


@contextlib.contextmanager
def _environment_kept(*names: str):
    """Undo what MLflow writes into ``os.environ`` inside: ``mlflow.set_tracking_uri`` and ``mlflow.set_experiment``
    also set ``MLFLOW_TRACKING_URI`` and ``MLFLOW_EXPERIMENT_ID`` (for subprocesses), which :func:`setup` reads
    before the config, so every later chain of the process (a notebook's second chain, another store, another
    experiment name) went to the first one's store and experiment, or failed on a store without that experiment."""
    before = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _pause_inside_sqlite_writes() -> None:
    """Test hook (``ORTFLOW_TEST_PAUSE=sqlite_write``, :func:`pipelines.base.interrupts.pause_point`): pause inside
    the transaction of the first metric insert, after the statement ran (sqlite's write lock held)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not event.contains(Engine, "after_cursor_execute", _after_execute):
        event.listen(Engine, "after_cursor_execute", _after_execute)


def _after_execute(conn, cursor, statement, parameters, context, executemany) -> None:
    if statement.lstrip().upper().startswith("INSERT INTO METRICS"):
        pause_point("sqlite_write")


def setup(cfg: DictConfig) -> Tracking:
    """Point MLflow at the store (after checking a server answers) and make sure the experiment exists."""
    uri = resolve_tracking_uri(cfg)
    retries, retry_seconds = int(cfg.mlflow.retries), float(cfg.mlflow.retry_seconds)
    check_reachable(uri, float(cfg.mlflow.connect_timeout))
    create_store_once(uri)
    if uri.startswith("sqlite:") and os.environ.get(PAUSE_ENV) == "sqlite_write":
        _pause_inside_sqlite_writes()
    with _environment_kept("MLFLOW_TRACKING_URI"):
        mlflow.set_tracking_uri(uri)  # for the fluent API in this process
    client = RetryingClient(MlflowClient(tracking_uri=uri), retries=retries, retry_seconds=retry_seconds)
    experiment_id = os.environ.get("MLFLOW_EXPERIMENT_ID")
    if experiment_id:
        experiment = client.get_experiment(experiment_id)
    else:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or cfg.mlflow.experiment_name
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            try:
                client.create_experiment(name, artifact_location=_artifact_location(cfg, uri, name))
            except MlflowException as exc:  # another job created it first
                if "already exists" not in str(exc).lower() and "unique constraint" not in str(exc).lower():
                    raise
            experiment = client.get_experiment_by_name(name)
    with _environment_kept("MLFLOW_EXPERIMENT_ID"):
        mlflow.set_experiment(experiment_id=experiment.experiment_id)
    return Tracking(uri, client, experiment.experiment_id, experiment.name, resolve_root(cfg), retries, retry_seconds)
