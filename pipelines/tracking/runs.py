"""Run lifecycles: a stage's run (the fluent active run) and the runs that group others (the chain, a sweep job),
tagged with the process that runs them (and a heartbeat), ended FAILED (KILLED on Ctrl-C or SIGTERM) with the
reason; a version registered from a stage run that does not end FINISHED is deleted (:func:`hold_version`)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import mlflow
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from ..base import periodic
from ..base.errors import ENDED_RUNS_ATTR, TrackingUnavailableError
from ..base.handoff import OUTER_RUN_ENV
from ..base.interrupts import deferred, raise_pending
from .lineage import source_tags
from .records import set_tags
from .retries import RetryingClient, call
from .store import Tracking

FAILURE_TAG = "ortflow.failure_reason"
#: the tag naming a run's parent
PARENT_TAG = MLFLOW_PARENT_RUN_ID


def failure_reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:4900]


HOST_TAG, PID_TAG, PID_START_TAG = "ortflow.host", "ortflow.pid", "ortflow.pid_start"
HEARTBEAT_TAG = "ortflow.heartbeat"
#: MLflow's setting of the system metrics' sampling interval (seconds), which wins over mlflow.system_metrics_interval
SAMPLING_INTERVAL_ENV = "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"
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


def heartbeat(tracking: Tracking, run_id: str, every: float = HEARTBEAT_SECONDS) -> contextlib.AbstractContextManager:
    """Refresh the run's ``ortflow.heartbeat`` tag every ``every`` seconds from a thread while the body runs
    (one attempt each, no retries: a missed beat only makes the run look older)."""
    return periodic.every(every, lambda: tracking.client._client.set_tag(run_id, HEARTBEAT_TAG, f"{time.time():.0f}"),
                          "ortflow-heartbeat")


def _open_run(tracking: Tracking, run_name: str, run_id: str | None, parent_run_id: str | None,
              tags: Mapping[str, str] | None) -> str:
    """A new run (nested under ``parent_run_id``, with the source tags ``mlflow run`` would set:
    :func:`pipelines.tracking.lineage.source_tags`), or the existing ``run_id`` with ``tags`` added; both tagged with this
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


#: the name a run of ``mlflow run`` gets when the project refused its parameters before anything ran
REFUSED_RUN_NAME = "refused-parameters"


def mark_refused_mlflow_run(run_id: str, reason: str) -> None:
    """``mlflow run`` created run ``run_id``, logging the parameters it was given, before the project could refuse
    them: the run is renamed :data:`REFUSED_RUN_NAME`, its reason is its description (``mlflow.note.content``) and
    ``ortflow.failure_reason``, and it ends FAILED, so that it cannot read as a run of those settings.

    It is not deleted: MLflow (3.x) then ends the run itself, and a deleted run makes it fail with a traceback of
    its own ("must be in the 'active' state"). The store is mlflow run's (``MLFLOW_TRACKING_URI``)."""
    client = mlflow.MlflowClient()
    note = f"Refused before anything ran: {reason} The parameters of this run were never applied."
    client.update_run(run_id, name=REFUSED_RUN_NAME)
    client.set_tag(run_id, "mlflow.note.content", note[:4900])
    client.set_tag(run_id, FAILURE_TAG, reason[:4900])
    client.set_terminated(run_id, "FAILED")


def run_mlflow_project(uri: str, options: list[str]) -> None:
    """``mlflow run <uri> <options>`` in this process. MLflow makes its run before it builds the project's
    environment and leaves it RUNNING when that fails: on an exception, each project run left RUNNING since the
    call began is ended FAILED, the reason as its note, and the exception is raised again with ``.ended_runs``
    (their ids). A failed command is MLflow's SystemExit (MLflow ends that run FAILED itself)."""
    from mlflow.cli import run as mlflow_run

    started = int(time.time() * 1000)
    try:
        mlflow_run.main([uri, *options], standalone_mode=False)
    except Exception as exc:  # noqa: BLE001 - MLflow's environment build failed (or its checks before it)
        client = mlflow.MlflowClient()
        ended = [r.info.run_id for r in client.search_runs(
            [e.experiment_id for e in client.search_experiments()],
            f"attributes.status = 'RUNNING' and attributes.start_time >= {started}")
            if r.data.tags.get("mlflow.source.type") == "PROJECT"]  # the run mlflow run made
        for run_id in ended:
            client.set_tag(run_id, "mlflow.note.content", f"mlflow run failed: {failure_reason(exc)}"[:4900])
            client.set_tag(run_id, FAILURE_TAG, failure_reason(exc)[:4900])
            client.set_terminated(run_id, "FAILED")
        exc.ended_runs = ended
        raise


def link_mlflow_run(tracking: Tracking, run_id: str) -> None:
    """Under ``mlflow run`` given no experiment (see :mod:`pipelines.mlproject`), tag mlflow run's run
    (``ortflow.pipeline_run``, ``ortflow.pipeline_experiment``) and the top-level run ``run_id`` of the pipelines
    (``ortflow.mlflow_run``) with each other."""
    outer = os.environ.get(OUTER_RUN_ENV)
    if outer:
        set_tags(tracking, outer, {"ortflow.pipeline_run": run_id, "ortflow.pipeline_experiment":
                                   f"{tracking.experiment_name} (id {tracking.experiment_id})"})
        set_tags(tracking, run_id, {"ortflow.mlflow_run": outer})


# the stage runs open in this process, and the versions registered from each (name, version, {alias: the version
# that held it before}): deleted when the run does not end FINISHED
_open_versions: dict[str, list[tuple[str, str, dict[str, str | None]]]] = {}


def hold_version(run_id: str, name: str, version: str, restore: Mapping[str, str | None] | None = None) -> None:
    """Version ``version`` of ``name`` was registered from the open stage run ``run_id`` (``restore``: the aliases
    it took, each with the version that held it): when the run ends otherwise than FINISHED, the version is
    deleted and the aliases go back (a version is registered only from a finished run with all its tags).
    Call it in the same :func:`pipelines.base.interrupts.deferred` block as the registration."""
    held = _open_versions.get(run_id)
    if held is None:  # not a stage run of this process (a sweep registering a finished trial)
        return
    for n, v, aliases in held:
        if (n, v) == (name, str(version)):
            aliases.update(restore or {})
            return
    held.append((name, str(version), dict(restore or {})))


def _drop_held_versions(client: Any, run_id: str) -> list[str]:
    """Delete the versions registered from ``run_id`` (:func:`hold_version`), giving their aliases back."""
    dropped = []
    for name, version, aliases in reversed(_open_versions.pop(run_id, [])):
        with contextlib.suppress(Exception):
            client.delete_model_version(name, version)
            dropped.append(f"{name} version {version}")
        for alias, holder in aliases.items():
            if holder:
                with contextlib.suppress(Exception):
                    client.set_registered_model_alias(name, alias, holder)
    return dropped


def _mark_failed(tracking: Tracking, run_id: str, exc: BaseException, fluent: bool) -> None:
    """Delete the versions registered from the run, tag the reason and end the run FAILED (KILLED on Ctrl-C or
    SIGTERM). When the store itself is lost, one attempt each, without retries: the error must reach the user
    now, not after minutes of waiting; after a signal, retries for a few seconds only. A signal received
    meanwhile is raised once the run is ended (and no call is retried while it waits)."""
    with deferred():
        _end_unfinished(tracking, run_id, exc, fluent)


def _end_unfinished(tracking: Tracking, run_id: str, exc: BaseException, fluent: bool) -> None:
    lost = isinstance(exc, TrackingUnavailableError)
    interrupted = isinstance(exc, KeyboardInterrupt)
    client = (tracking.client._client if lost else RetryingClient(tracking.client._client, 3, 5.0) if interrupted
              else tracking.client)
    dropped = _drop_held_versions(client, run_id)
    with contextlib.suppress(Exception):
        client.set_tag(run_id, FAILURE_TAG, failure_reason(exc))
    if dropped:
        with contextlib.suppress(Exception):
            client.set_tag(run_id, "ortflow.registered", f"false ({', '.join(dropped)} deleted: the run did not "
                                                         "finish)")
            client.delete_tag(run_id, "ortflow.registered_version")
    status = _status_of(exc)
    with contextlib.suppress(Exception):
        if fluent:  # pops the active run even when the store does not answer
            if lost:
                mlflow.end_run(status=status)
            else:
                call(mlflow.end_run, status=status, **({"retries": 3, "retry_seconds": 5.0} if interrupted else
                                                       {"retries": tracking.retries,
                                                        "retry_seconds": tracking.retry_seconds}))
        else:
            client.set_terminated(run_id, status)
    with contextlib.suppress(AttributeError, TypeError):
        setattr(exc, ENDED_RUNS_ATTR, [*getattr(exc, ENDED_RUNS_ATTR, []), f"{run_id} {status}"])


def _status_of(exc: BaseException) -> str:
    return "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"


@contextlib.contextmanager
def parent_run(tracking: Tracking, run_name: str, run_id: str | None = None, parent_run_id: str | None = None,
               tags: Mapping[str, str] | None = None) -> Iterator[str]:
    """A run that groups others (the chain, a sweep job); not the fluent active run. Ends FAILED on errors."""
    with deferred(raise_at_end=False):  # a signal while the run is made: raised once it can end the run
        run_id = _open_run(tracking, run_name, run_id, parent_run_id, tags)
    try:
        raise_pending()
        yield run_id
    except BaseException as exc:
        _mark_failed(tracking, run_id, exc, fluent=False)
        raise
    tracking.client.set_terminated(run_id, "FINISHED")


@contextlib.contextmanager
def stage_run(tracking: Tracking, run_name: str, parent_run_id: str | None = None, run_id: str | None = None,
              tags: Mapping[str, str] | None = None, system_metrics: bool = False,
              system_metrics_interval: float | None = None) -> Iterator[str]:
    """The fluent active run of one stage (``mlflow.onnx.log_model`` needs one); with ``system_metrics``, MLflow
    samples CPU, memory, disk and network into it while it is active (``mlflow.system_metrics``, needs psutil),
    every ``system_metrics_interval`` seconds unless MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL is set.

    A new run is created under ``parent_run_id`` unless ``run_id`` names an existing one (``mlflow run``'s run).
    On an exception the run gets the reason as the tag ``ortflow.failure_reason`` and ends FAILED.
    """
    ours = bool(system_metrics and system_metrics_interval and not os.environ.get(SAMPLING_INTERVAL_ENV))
    with deferred(raise_at_end=False):  # a signal while the run is made and started: raised once it can end it
        run_id = _open_run(tracking, run_name, run_id, parent_run_id, tags)
        if ours:  # read by the run's monitor when the run starts
            mlflow.set_system_metrics_sampling_interval(system_metrics_interval)
        try:
            tracking.call(mlflow.start_run, run_id=run_id, nested=mlflow.active_run() is not None,
                          log_system_metrics=True if system_metrics else None)  # None: MLflow's own setting
        finally:
            if ours:
                mlflow.set_system_metrics_sampling_interval(None)
    _open_versions[run_id] = []
    try:
        raise_pending()
        with heartbeat(tracking, run_id):
            yield run_id
    except BaseException as exc:
        _mark_failed(tracking, run_id, exc, fluent=True)
        raise
    tracking.call(mlflow.end_run, status="FINISHED")
    _open_versions.pop(run_id, None)


def select_runs(tracking: Tracking, run_ids: list[str], experiment: str | None, tags: Mapping[str, str]) -> list:
    """The runs ``run_ids``, then those of ``experiment`` holding every tag of ``tags``, oldest first (each once).
    A run id the store lacks, an experiment it lacks, or tags no run of it holds is a ``LookupError`` saying so."""
    from mlflow.exceptions import MlflowException

    found = []
    for run_id in run_ids:
        try:
            found.append(tracking.client.get_run(run_id))
        except MlflowException as exc:
            raise LookupError(f"the run {run_id!r} is not in {tracking.uri}: "
                              f"{str(exc).splitlines()[0][:300]}") from exc
    if experiment is not None:
        exp = tracking.client.get_experiment_by_name(experiment)
        if exp is None:
            raise LookupError(f"{tracking.uri} has no experiment {experiment!r} (--experiment)")
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        selected = tracking.client.search_runs([exp.experiment_id], query, max_results=10000,
                                               order_by=["attributes.start_time ASC"])
        if not selected:
            raise LookupError(f"no run of the experiment {experiment!r} holds the tags {dict(tags)} (--tag)")
        known = {r.info.run_id for r in found}
        found += [r for r in selected if r.info.run_id not in known]
    return found

