"""Everything the pipelines say to MLflow, and the only package of ``pipelines`` that imports it.

The stages, the chain, the runner, the CLI and the bundle talk to the tracking store through the names below
(``from pipelines import tracking as tr``): :func:`setup` gives the :class:`Tracking` connection; runs are opened
by :func:`stage_run` and :func:`parent_run`; :func:`log_config`, :func:`log_metrics`, :func:`log_param`,
:func:`set_tags`, :func:`log_artifact` record; :func:`download_artifacts` reads back.
Every store call retries transient errors (:mod:`.retries`); a store that stays away ends in
:class:`TrackingUnavailableError`. ``tests/test_tracking_boundary.py`` keeps ``import mlflow`` inside this package.

| module | holds |
|---|---|
| ``retries`` | which errors are transient, the retrying call and client |
| ``locks`` | file locks next to a local sqlite store |
| ``store`` | the store and experiment: URI, artifact location, reachability, :func:`setup`, :class:`Tracking` |
| ``runs`` | run lifecycles: process tags and heartbeat, failure reasons, stage and parent runs, versions of unfinished runs deleted |
| ``records`` | config as params and YAML, metrics, tags, artifacts; artifacts read back |
| ``epoch_metrics`` | the buffered epoch-metrics callback and :func:`resend` of what it spooled |
| ``lineage`` | the data a stage read as dataset inputs, the source tags, the logged model's name, a registered version's run and lineage tags |
| ``checkpoints`` | the train stage's checkpoints logged, and resumed from |
| ``promotion`` | registering a version and the alias-based promotion gate |
| ``sweep`` | a ``-m`` sweep's run, a failed job's run, its best trial registered (the callback is in ``orchestration``) |
| ``serving_model`` | the registered model's code (logged as a file; imports nothing of ``pipelines``) |
| ``deploy`` | the deploy graph logged as one model with a pyfunc and an onnx flavor; its signature and requirements |
| ``logger`` | :class:`MlflowLogger`, the callback that records a fit made without the pipelines (notebooks) |
"""

from __future__ import annotations

from ..base.errors import TrackingUnavailableError
from .epoch_metrics import MlflowMetricsCallback, resend
from .locks import file_lock, lock_path, sqlite_path
from .records import (
    MAX_PARAM_LENGTH,
    download_artifacts,
    flatten,
    hydra_overrides,
    is_finite,
    log_artifact,
    log_config,
    log_folder,
    log_metrics,
    log_param,
    param_differences,
    run_params,
    set_tags,
)
from .retries import RetryingClient, call, is_transient
from .runs import (
    FAILURE_TAG,
    HEARTBEAT_SECONDS,
    HEARTBEAT_TAG,
    HOST_TAG,
    PARENT_TAG,
    PID_START_TAG,
    PID_TAG,
    REFUSED_RUN_NAME,
    failure_reason,
    heartbeat,
    is_alive,
    link_mlflow_run,
    mark_refused_mlflow_run,
    parent_run,
    run_mlflow_project,
    process_tags,
    select_runs,
    stage_run,
)
from .store import (
    HTTP_DEFAULTS,
    Tracking,
    artifact_folder_name,
    check_reachable,
    create_store_once,
    resolve_root,
    resolve_tracking_uri,
    setup,
)

__all__ = [
    "TrackingUnavailableError", "MlflowMetricsCallback", "resend", "file_lock", "lock_path", "sqlite_path",
    "MAX_PARAM_LENGTH", "download_artifacts", "flatten", "hydra_overrides", "is_finite", "log_artifact",
    "log_config", "log_folder", "log_metrics", "log_param", "param_differences", "run_params", "set_tags", "RetryingClient", "call", "is_transient",
    "FAILURE_TAG", "HEARTBEAT_SECONDS", "HEARTBEAT_TAG", "HOST_TAG", "PARENT_TAG", "PID_START_TAG", "PID_TAG",
    "REFUSED_RUN_NAME", "failure_reason", "heartbeat", "is_alive", "link_mlflow_run", "mark_refused_mlflow_run",
    "parent_run", "process_tags", "run_mlflow_project", "select_runs", "stage_run",
    "HTTP_DEFAULTS", "Tracking", "artifact_folder_name", "check_reachable", "create_store_once", "resolve_root",
    "resolve_tracking_uri", "setup",
]
