"""Everything the pipelines say to MLflow: where runs go, run lifecycles, params, metrics, artifacts.

Defaults: an embedded sqlite store ``sqlite:///<root>/mlflow.db`` with artifacts under ``<root>/mlartifacts``,
``<root>`` being the directory the command started from (``hydra.job.chdir`` is false). ``MLFLOW_TRACKING_URI``,
``MLFLOW_EXPERIMENT_NAME``/``MLFLOW_EXPERIMENT_ID`` and ``MLFLOW_RUN_ID`` (set by ``mlflow run``) win over the config.

Every store call goes through :func:`call`, which retries transient errors ("database is locked" when parallel
jobs write to one sqlite file, a server that is down or busy) with jittered exponential back-off, for at most
``mlflow.retries`` attempts within ``mlflow.retry_seconds``. A tracking server is asked for its ``/health`` before
anything runs (:func:`check_reachable`); a store that stays away mid-run ends in :class:`TrackingUnavailableError`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import mlflow
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from omegaconf import DictConfig, OmegaConf

from ortflow.callbacks import Callback
from ortflow.graph import safe_join

from .config import to_container
from .errors import TrackingUnavailableError
from .lineage import source_tags
from .mlproject import OUTER_RUN_ENV
from .paths import original_cwd

_log = logging.getLogger("pipelines.tracking")
FAILURE_TAG = "ortflow.failure_reason"
MAX_PARAM_LENGTH = 6000
_TRANSIENT = ("database is locked", "database table is locked", "temporarily unavailable", "connection refused",
              "connection reset", "max retries exceeded")


def is_transient(exc: BaseException) -> bool:
    """Errors worth a retry: sqlite lock contention, a server that is briefly unavailable."""
    text = f"{type(exc).__name__}: {exc}".lower()
    if isinstance(exc, MlflowException) and "already exists" in text:
        return False
    return any(marker in text for marker in _TRANSIENT)


def call(fn: Callable, *args: Any, retries: int = 8, retry_seconds: float = 60.0, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, retried on transient store errors: ``retries`` times within ``retry_seconds``."""
    deadline = time.monotonic() + retry_seconds
    for attempt in range(retries + 1):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - filtered just below
            left = deadline - time.monotonic()
            if attempt >= retries or left <= 0 or not is_transient(exc):
                raise
            delay = min(left, 5.0, 0.05 * 2**attempt * (0.5 + random.random()))
            _log.warning("MLflow store busy (%s), retry %d/%d in %.2f s", str(exc).splitlines()[0][:200],
                         attempt + 1, retries, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


class RetryingClient:
    """An ``MlflowClient`` whose methods retry transient errors (see :func:`call`)."""

    def __init__(self, client: MlflowClient, retries: int = 8, retry_seconds: float = 60.0):
        self._client = client
        self.retries = retries
        self.retry_seconds = retry_seconds

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def retrying(*args: Any, **kwargs: Any) -> Any:
            return call(attr, *args, retries=self.retries, retry_seconds=self.retry_seconds, **kwargs)

        return retrying


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
        return f"mlflow ui --backend-store-uri {self.uri} --port 5000   # then open http://127.0.0.1:5000"


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


def sqlite_path(uri: str) -> Path | None:
    """The database file of a local ``sqlite:///`` URI (None for any other store)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):].split("?", 1)[0])


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created with its folder) against every process of this machine."""
    if os.name != "posix":  # pragma: no cover - the pipelines run on Linux and macOS
        yield
        return
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def lock_path(db: Path, name: str) -> Path:
    """Where the lock ``name`` of the sqlite database ``db`` lives: ``<db folder>/.ortflow/<name>.lock``."""
    return db.parent / ".ortflow" / f"{name}.lock"


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


def setup(cfg: DictConfig) -> Tracking:
    """Point MLflow at the store (after checking a server answers) and make sure the experiment exists."""
    uri = resolve_tracking_uri(cfg)
    retries, retry_seconds = int(cfg.mlflow.retries), float(cfg.mlflow.retry_seconds)
    check_reachable(uri, float(cfg.mlflow.connect_timeout))
    create_store_once(uri)
    mlflow.set_tracking_uri(uri)
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
    mlflow.set_experiment(experiment_id=experiment.experiment_id)
    return Tracking(uri, client, experiment.experiment_id, experiment.name, resolve_root(cfg), retries, retry_seconds)


# ----------------------------------------------------------------------------------------------- run lifecycle


def failure_reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:4900]


HOST_TAG, PID_TAG, PID_START_TAG = "ortflow.host", "ortflow.pid", "ortflow.pid_start"
HEARTBEAT_TAG = "ortflow.heartbeat"
#: a stage run's ``ortflow.heartbeat`` tag is refreshed this often; three missed beats mean its process is gone
HEARTBEAT_SECONDS = 30.0


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux ``/proc``), None when unknown; a
    zombie counts as gone ("Z")."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return "Z" if fields[0] in ("Z", "X") else fields[19]


def process_tags() -> dict[str, str]:
    """Where this run's process lives (host, pid, pid start time) and a first heartbeat: what :func:`is_alive`
    reads."""
    import socket

    tags = {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid()), HEARTBEAT_TAG: f"{time.time():.0f}"}
    start = _process_start(os.getpid())
    if start:
        tags[PID_START_TAG] = start
    return tags


def is_alive(run: Any, now: float | None = None) -> bool:
    """Whether the process that ran ``run`` (an MLflow Run) still lives: on this host, its pid (with the same
    start time); elsewhere, a heartbeat younger than three beats. Runs without these tags count as gone."""
    import socket

    tags = run.data.tags
    if HOST_TAG not in tags or PID_TAG not in tags:
        return False
    if tags[HOST_TAG] == socket.gethostname():
        pid = int(tags[PID_TAG])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        start = _process_start(pid)
        return start != "Z" and (start is None or tags.get(PID_START_TAG) in (None, start))
    try:
        beat = float(tags.get(HEARTBEAT_TAG, "0"))
    except ValueError:
        return False
    return (now if now is not None else time.time()) - beat < 3 * HEARTBEAT_SECONDS


@contextlib.contextmanager
def heartbeat(tracking: Tracking, run_id: str, every: float = HEARTBEAT_SECONDS) -> Iterator[None]:
    """Refresh the run's ``ortflow.heartbeat`` tag every ``every`` seconds from a thread while the body runs
    (one attempt each, no retries: a missed beat only makes the run look older)."""
    import threading

    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            with contextlib.suppress(Exception):
                tracking.client._client.set_tag(run_id, HEARTBEAT_TAG, f"{time.time():.0f}")

    thread = threading.Thread(target=beat, name="ortflow-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()


def _open_run(tracking: Tracking, run_name: str, run_id: str | None, parent_run_id: str | None,
              tags: Mapping[str, str] | None) -> str:
    """A new run (nested under ``parent_run_id``, with the source tags ``mlflow run`` would set:
    :func:`pipelines.lineage.source_tags`), or the existing ``run_id`` with ``tags`` added; both tagged with this
    process (:func:`process_tags`)."""
    if run_id is not None:
        set_tags(tracking, run_id, {**(tags or {}), **process_tags()})
        return run_id
    all_tags = {**source_tags(), **(tags or {}), **process_tags()}
    if parent_run_id:
        all_tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
    run_id = tracking.client.create_run(tracking.experiment_id, run_name=run_name, tags=all_tags).info.run_id
    if not parent_run_id:
        link_mlflow_run(tracking, run_id)
    return run_id


def link_mlflow_run(tracking: Tracking, run_id: str) -> None:
    """Under ``mlflow run`` given no experiment (see :mod:`pipelines.mlproject`), tag mlflow run's run
    (``ortflow.pipeline_run``, ``ortflow.pipeline_experiment``) and the top-level run ``run_id`` of the pipelines
    (``ortflow.mlflow_run``) with each other."""
    outer = os.environ.get(OUTER_RUN_ENV)
    if outer:
        set_tags(tracking, outer, {"ortflow.pipeline_run": run_id, "ortflow.pipeline_experiment":
                                   f"{tracking.experiment_name} (id {tracking.experiment_id})"})
        set_tags(tracking, run_id, {"ortflow.mlflow_run": outer})


def _mark_failed(tracking: Tracking, run_id: str, exc: BaseException, fluent: bool) -> None:
    """Tag the reason and end the run FAILED (KILLED on Ctrl-C). When the store itself is lost, one attempt
    each, without retries: the error must reach the user now, not after minutes of waiting."""
    lost = isinstance(exc, TrackingUnavailableError)
    client = tracking.client._client if lost else tracking.client
    with contextlib.suppress(Exception):
        client.set_tag(run_id, FAILURE_TAG, failure_reason(exc))
    with contextlib.suppress(Exception):
        if fluent:  # pops the active run even when the store does not answer
            (mlflow.end_run if lost else functools.partial(tracking.call, mlflow.end_run))(status=_status_of(exc))
        else:
            client.set_terminated(run_id, _status_of(exc))


def _status_of(exc: BaseException) -> str:
    return "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"


@contextlib.contextmanager
def parent_run(tracking: Tracking, run_name: str, run_id: str | None = None, parent_run_id: str | None = None,
               tags: Mapping[str, str] | None = None) -> Iterator[str]:
    """A run that groups others (the chain, a sweep job); not the fluent active run. Ends FAILED on errors."""
    run_id = _open_run(tracking, run_name, run_id, parent_run_id, tags)
    try:
        yield run_id
    except BaseException as exc:
        _mark_failed(tracking, run_id, exc, fluent=False)
        raise
    tracking.client.set_terminated(run_id, "FINISHED")


@contextlib.contextmanager
def stage_run(tracking: Tracking, run_name: str, parent_run_id: str | None = None, run_id: str | None = None,
              tags: Mapping[str, str] | None = None, system_metrics: bool = False) -> Iterator[str]:
    """The fluent active run of one stage (``mlflow.onnx.log_model`` needs one); with ``system_metrics``, MLflow
    samples CPU, memory, disk and network into it while it is active (``mlflow.system_metrics``, needs psutil).

    A new run is created under ``parent_run_id`` unless ``run_id`` names an existing one (``mlflow run``'s run).
    On an exception the run gets the reason as the tag ``ortflow.failure_reason`` and ends FAILED.
    """
    run_id = _open_run(tracking, run_name, run_id, parent_run_id, tags)
    tracking.call(mlflow.start_run, run_id=run_id, nested=mlflow.active_run() is not None,
                  log_system_metrics=True if system_metrics else None)  # None: MLflow's own setting
    try:
        with heartbeat(tracking, run_id):
            yield run_id
    except BaseException as exc:
        _mark_failed(tracking, run_id, exc, fluent=True)
        raise
    tracking.call(mlflow.end_run, status="FINISHED")


# ---------------------------------------------------------------------------------------------------- logging


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys; lists stay values (``model.hidden_layer_sizes: [32, 16]``)."""
    out: dict[str, Any] = {}
    if isinstance(value, Mapping):
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}{key}."))
    else:
        out[prefix[:-1]] = value
    return out


def log_config(tracking: Tracking, run_id: str, cfg: DictConfig, folder: Path) -> None:
    """Flattened resolved config as params, the YAML (and Hydra's overrides) as artifacts under ``config/``."""
    resolved = to_container(cfg)
    params = [Param(k, _param_text(v)) for k, v in flatten(resolved).items()]
    for start in range(0, len(params), 100):
        tracking.client.log_batch(run_id, params=params[start:start + 100])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(resolved)))
    overrides = hydra_overrides()
    if overrides is not None:
        (folder / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(overrides)))
        tracking.client.set_tag(run_id, "ortflow.overrides", " ".join(overrides)[:4900] or "(none)")
    tracking.client.log_artifacts(run_id, str(folder), "config")


def hydra_overrides() -> list[str] | None:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return list(HydraConfig.get().overrides.task)


def _param_text(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return text[:MAX_PARAM_LENGTH]


def log_metrics(tracking: Tracking, run_id: str, metrics: Mapping[str, Any], step: int = 0) -> None:
    """Log the finite numbers of ``metrics`` in one batch (None and non-numbers are skipped)."""
    now = int(time.time() * 1000)
    batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if _is_number(v)]
    for start in range(0, len(batch), 1000):
        tracking.client.log_batch(run_id, metrics=batch[start:start + 1000])


def set_tags(tracking: Tracking, run_id: str, tags: Mapping[str, Any]) -> None:
    items = [RunTag(k, str(v)[:4900]) for k, v in tags.items() if v is not None]
    if items:
        tracking.client.log_batch(run_id, tags=items)


def log_artifact(tracking: Tracking, run_id: str, path: str | Path, artifact_path: str | None = None) -> str:
    """Log one file; returns its artifact path inside the run."""
    path = Path(path)
    tracking.client.log_artifact(run_id, str(path), artifact_path)
    return f"{artifact_path}/{path.name}" if artifact_path else path.name


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) or (hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0)


def is_finite(value: Any) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


class MlflowMetricsCallback(Callback):
    """Sends each epoch's record (train/validation loss, learning rate, epoch time) to a run, with step=epoch.

    Records are kept in memory (the epoch loop pays for one list append) and handed to MLflow's asynchronous
    logging in one ``log_batch`` every ``flush_seconds`` seconds (long runs stay live in the UI), every
    ``flush_every`` epochs when that is > 0, and at the end of training; a background thread writes.
    :meth:`wait` blocks until everything is stored (a batch that failed is written again synchronously, with
    retries): call it after other work so the last write overlaps that work.
    ``overhead_seconds`` is the time spent in this callback plus in :meth:`wait`. The learning rate is logged
    at the first epoch and whenever it changes. A training resumed from a checkpoint logs the epochs the
    checkpoint holds first (its ``history_`` when training begins), so the run holds the whole curve.
    """

    KEYS = {"train_loss": "train_loss", "validation_loss": "validation_loss", "time": "epoch_time_seconds"}

    def __init__(self, tracking: Tracking, run_id: str, flush_every: int = 0, flush_seconds: float = 10.0,
                 synchronous: bool = False):
        self.tracking = tracking
        self.run_id = run_id
        self.flush_every = flush_every
        self.flush_seconds = flush_seconds
        self.synchronous = synchronous
        self.overhead_seconds = 0.0
        self.loop_seconds = 0.0  # the part spent inside the epoch loop (on_epoch_end)
        self.flushes = 0
        self._records: list[tuple[int, dict]] = []
        self._pending: list[tuple[Any, list[Metric]]] = []
        self._last_flush = time.perf_counter()
        self._last_lr: float | None = None

    def on_train_begin(self, trainer: Any) -> None:
        # resumed from a checkpoint: its epochs go to this run too, so the whole curve is in one run (steps 1..N)
        now = int(time.time() * 1000)
        self._records.extend((now, record) for record in getattr(trainer, "history_", None) or ())
        self._last_flush = time.perf_counter()

    def on_epoch_end(self, trainer: Any, record: dict) -> None:
        start = time.perf_counter()
        self._records.append((int(time.time() * 1000), record))
        if (self.flush_every and len(self._records) >= self.flush_every) or (
                start - self._last_flush >= self.flush_seconds):
            self.flush()
        elapsed = time.perf_counter() - start
        self.loop_seconds += elapsed
        self.overhead_seconds += elapsed

    def on_train_end(self, trainer: Any) -> None:
        start = time.perf_counter()
        self.flush()  # queued: call wait() once the caller has done its own work
        self.overhead_seconds += time.perf_counter() - start

    def _metrics(self) -> list[Metric]:
        metrics = []
        for now, record in self._records:
            step = int(record["epoch"])
            for key, name in self.KEYS.items():
                value = record.get(key)
                if value is not None and is_finite(value):
                    metrics.append(Metric(name, float(value), now, step))
            lr = record.get("learning_rate")
            if lr is not None and lr != self._last_lr and is_finite(lr):
                metrics.append(Metric("learning_rate", float(lr), now, step))
                self._last_lr = lr
        self._records = []
        return metrics

    def flush(self) -> None:
        """Queue (or write, when synchronous) the buffered epochs. Never raises: a batch the store refused stays
        pending, for :meth:`wait` to write again (training goes on while a tracking server is down)."""
        metrics = self._metrics()
        for begin in range(0, len(metrics), 1000):
            chunk = metrics[begin:begin + 1000]
            operation = None
            try:
                operation = self.tracking.client._client.log_batch(
                    self.run_id, metrics=chunk, synchronous=self.synchronous)
                if self.synchronous:
                    continue
            except Exception as exc:  # noqa: BLE001 - kept pending, written again by wait()
                _log.warning("epoch metrics not stored yet (%s); kept for a later write", str(exc).splitlines()[0])
            self._pending.append((operation, chunk))
            self.flushes += 1
        self._last_flush = time.perf_counter()

    def wait(self) -> None:
        """Block until every epoch metric is stored; batches whose write failed are written again with the
        store's retries. Raises when the store stays away; :meth:`spool` then saves what was not stored."""
        start = time.perf_counter()
        try:
            self.flush()
            while self._pending:
                operation, chunk = self._pending[0]
                try:
                    if operation is None:
                        raise RuntimeError("not written yet")
                    operation.wait()
                except Exception:  # noqa: BLE001 - written again, with retries
                    self.tracking.client.log_batch(self.run_id, metrics=chunk)
                self._pending.pop(0)
        finally:
            self.overhead_seconds += time.perf_counter() - start

    def spool(self, path: str | Path, reason: str) -> int:
        """Write the epoch metrics not known to be stored, and why, to ``path`` (JSON, see :func:`resend`)."""
        metrics = [m for _, chunk in self._pending for m in chunk] + self._metrics()
        self._pending = []
        Path(path).write_text(json.dumps({
            "tracking_uri": self.tracking.uri, "run_id": self.run_id, "failure_reason": reason,
            "metrics": [[m.key, m.value, m.timestamp, m.step] for m in metrics]}))
        return len(metrics)


def resend(path: str | Path, tracking_uri: str | None = None, connect_timeout: float = 5.0, retries: int = 8,
           retry_seconds: float = 60.0) -> int:
    """Send the metrics spooled by :meth:`MlflowMetricsCallback.spool` to their run, and end that run FAILED with
    the spooled reason if it is still RUNNING (its stage did not finish logging); returns the metric count.

    The stages' policy: the server must answer within ``connect_timeout`` (else :class:`TrackingUnavailableError`
    at once), and each call retries transient errors ``retries`` times within ``retry_seconds``."""
    spooled = json.loads(Path(path).read_text())
    uri = tracking_uri or spooled["tracking_uri"]
    check_reachable(uri, connect_timeout)
    client = RetryingClient(MlflowClient(tracking_uri=uri), retries=retries, retry_seconds=retry_seconds)
    run_id = spooled["run_id"]
    metrics = [Metric(key, float(value), int(timestamp), int(step)) for key, value, timestamp, step in
               spooled["metrics"]]
    for begin in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[begin:begin + 1000])
    if client.get_run(run_id).info.status == "RUNNING":
        client.set_tag(run_id, FAILURE_TAG, spooled["failure_reason"][:4900])
        client.set_terminated(run_id, "FAILED")
    return len(metrics)
