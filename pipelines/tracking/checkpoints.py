"""The train stage's checkpoints in MLflow: logged while training, resumed from after the process died.

**Logging.** :class:`MlflowCheckpoint` is an :class:`ortflow.Checkpoint` that logs each checkpoint it writes to
the run's artifacts (from a background thread), replacing the previous one: first under ``checkpoint/``, then,
once that copy is complete, under ``checkpoint_backup/``. Each copy ends with ``checkpoint_manifest.json`` (the
epoch and the sha256 of every file). Artifact stores overwrite file by file, so a process killed while logging
leaves a copy torn; with two copies written one after the other, at most one is, and the manifest tells which.

**Resuming.** ``trainer.resume_from`` takes a local checkpoint folder, an artifact URI
(``runs:/<train run id>/checkpoint``), or a bare run id (that run's ``checkpoint/``). :func:`resume_point`
downloads it, takes ``checkpoint/`` when its files match its manifest and ``checkpoint_backup/`` otherwise (a
logged copy without a manifest is not trusted; a local folder is the user's own and needs none), and
tags the new run ``ortflow.resumed_from``, ``ortflow.resumed_from_run`` and ``ortflow.resumed_from_epoch``.
Once the checkpoint is restored, :class:`MarkResumed` ends the source run as ``KILLED`` with the tag
``ortflow.resumed_by`` when it is still ``RUNNING`` and its process is gone (:func:`pipelines.tracking.is_alive`:
its pid on this host, its heartbeat elsewhere), and so the parent run of the chain it ran in.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from omegaconf import DictConfig

import ortflow
from ortflow.trainers.callbacks import Callback
from ortflow.trainers.checkpoint import file_digests, first_mismatch, read_manifest
from ortflow.exceptions import CheckpointError  # no usable checkpoint where trainer.resume_from points

from .. import tracking as tr
from ..base.schema import to_container
from .records import download_artifacts

_log = logging.getLogger("pipelines.checkpoints")

ARTIFACT_PATH = "checkpoint"
BACKUP_SUFFIX = "_backup"
MANIFEST = "checkpoint_manifest.json"
META = "trainer.json"  # ortflow's checkpoint metadata (epoch, history, random state)
RESUMED_FROM_TAG = "ortflow.resumed_from"
RESUMED_FROM_RUN_TAG = "ortflow.resumed_from_run"
RESUMED_FROM_EPOCH_TAG = "ortflow.resumed_from_epoch"
RESUMED_BY_TAG = "ortflow.resumed_by"
# settings that may differ between a run and its resumption without changing the result
_FREE_KEYS = ("trainer.max_iter", "trainer.checkpoint_every", "trainer.checkpoint_every_rows", "trainer.resume_from",
              "trainer.verbose")
_COMPARED = ("seed", "data.", "model.", "loss.", "penalty.", "trainer.")
_RUN_ID = re.compile(r"^[0-9a-fA-F]{32}$")
_RUNS_URI = re.compile(r"^runs:/([^/]+)/*(.*)$")


# ------------------------------------------------------------------------------------------------ manifest


def _files(folder: Path) -> list[Path]:
    """The checkpoint's files in the order they are logged: state first, ortflow's metadata, the manifest last."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (MANIFEST, META))
    return files + [p for p in (folder / META, folder / MANIFEST) if p.is_file()]


def write_manifest(folder: str | Path, epoch: int) -> Path:
    folder = Path(folder)
    files = file_digests(folder, [p for p in _files(folder) if p.name != MANIFEST])
    path = folder / MANIFEST
    path.write_text(json.dumps({"epoch": epoch, "files": files}, indent=1))
    return path


def check_folder(folder: str | Path) -> str:
    """``"ok"`` (files match the manifest), ``"unverified"`` (no manifest: written before manifests existed),
    ``"torn"`` (files differ from the manifest: the writer died while logging it) or ``"missing"``."""
    folder = Path(folder)
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return "unverified" if (folder / META).is_file() else "missing"
    try:
        files = json.loads(manifest.read_text())["files"]
        ok = first_mismatch(folder, files) is None
    except (ValueError, KeyError, TypeError):
        return "torn"
    return "ok" if ok else "torn"


def checkpoint_epoch(folder: str | Path) -> int | None:
    """The epoch ortflow's ``trainer.json`` holds, read only once it matches its own checksum."""
    try:
        return int(read_manifest(folder)["epoch"])
    except (OSError, ValueError, KeyError, TypeError, CheckpointError):
        return None


# ------------------------------------------------------------------------------------------------- logging


def _link_tree(source: Path, target: Path) -> None:
    """``target``: the files of ``source`` as hard links (a copy where links are not possible).

    The checkpoint's files are never modified once written (a new checkpoint is a new folder renamed into
    place), so the links keep the content of this checkpoint.
    """
    shutil.rmtree(target, ignore_errors=True)
    try:
        shutil.copytree(source, target, copy_function=os.link)
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)


class MlflowCheckpoint(ortflow.Checkpoint):
    """Write a checkpoint every ``every`` epochs (and after the last one), and during a streamed fit every
    ``every_rows`` rows inside an epoch, into ``folder`` and log it to the run.

    With ``background`` (the default) the epoch loop only links the new checkpoint's files aside; a thread
    writes the manifest and logs it, the newest first: a checkpoint written while the previous one is still
    being logged replaces the one waiting, so a slow or unreachable store never holds training up;
    ``on_train_end`` waits until the last checkpoint is logged. ``background=False`` logs in the loop.
    A checkpoint that cannot be logged is reported as a warning and training goes on. At the end the run gets
    the metrics ``checkpoints_logged``, ``time_checkpoint_seconds`` (time the epoch loop spent on checkpoints:
    writing them, and logging them when not in the background) and ``time_checkpoint_wait_seconds`` (the final
    wait for the logging thread).
    """

    def __init__(self, folder: str | Path, every: int, tracking: tr.Tracking, run_id: str,
                 artifact_path: str = ARTIFACT_PATH, background: bool = True, every_rows: int | None = None):
        super().__init__(folder, every=every, every_rows=every_rows)
        self.tracking = tracking
        self.run_id = run_id
        self.artifact_path = artifact_path
        self.background = background
        self.spool = Path(folder).with_name(Path(folder).name + ".logging")
        self.seconds = 0.0
        self.wait_seconds = 0.0
        self.logged = 0
        self.failures = 0
        self._written = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._next: tuple[Path, int] | None = None
        self._thread: threading.Thread | None = None
        self._stop = False
        self._last_failed = False

    def _save(self, trainer: Any) -> None:
        begin = time.perf_counter()
        super()._save(trainer)
        self.seconds += time.perf_counter() - begin

    def on_checkpoint(self, trainer: Any, folder: str, epoch: int) -> None:
        if not self.background:
            self._log_checkpoint(Path(folder), epoch)
            return
        # the next checkpoint replaces ``folder`` while this one is logged: keep its files aside (hard links), in a
        # folder of its own (a streamed epoch writes several checkpoints of the same epoch count)
        self._written += 1
        snapshot = self.spool / f"{self._written:09d}-epoch-{epoch}"
        _link_tree(Path(folder), snapshot)
        with self._lock:
            superseded, self._next = self._next, (snapshot, epoch)
        if superseded is not None:  # still waiting: never logged, the new one replaces it
            shutil.rmtree(superseded[0], ignore_errors=True)
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="ortflow-checkpoint-logging", daemon=True)
            self._thread.start()
        self._wake.set()

    def _work(self) -> None:
        while True:
            self._wake.wait()
            with self._lock:
                self._wake.clear()
                item, self._next = self._next, None
                stop = self._stop
            if item is not None:
                if stop and self._last_failed:
                    # training has ended and the store just failed (after its retries): do not make the end of
                    # training wait for it a second time; the local checkpoint stays in ``folder``
                    _log.warning("last checkpoint (epoch %d) not logged to run %s: the store did not answer; "
                                 "it is in %s", item[1], self.run_id, self.folder)
                else:
                    self._log_checkpoint(*item)
                shutil.rmtree(item[0], ignore_errors=True)
            if stop:  # set once training ended, after its last checkpoint: nothing comes after ``item``
                return

    def _log_checkpoint(self, folder: Path, epoch: int) -> None:
        try:
            write_manifest(folder, epoch)
            self.log_folder(folder)
            self.logged += 1
            self._last_failed = False
        except Exception as exc:  # noqa: BLE001 - a checkpoint that could not be logged must not end training
            self.failures += 1
            self._last_failed = True
            _log.warning("checkpoint of epoch %d not logged to run %s (the local one is in %s): %s", epoch,
                         self.run_id, self.folder, tr.failure_reason(exc))

    def log_folder(self, folder: str | Path) -> None:
        """Log ``folder`` under ``checkpoint/``, then under ``checkpoint_backup/``, each copy manifest last."""
        folder = Path(folder)
        files = _files(folder)
        for slot in (self.artifact_path, self.artifact_path + BACKUP_SUFFIX):
            for path in files:
                sub = path.parent.relative_to(folder).as_posix()
                self.tracking.client.log_artifact(self.run_id, str(path), slot if sub == "." else f"{slot}/{sub}")

    def wait(self) -> None:
        """Block until every checkpoint handed to the logging thread is logged (or failed)."""
        if self._thread is None:
            return
        begin = time.perf_counter()
        with self._lock:
            self._stop = True
        self._wake.set()
        self._thread.join()
        self._thread, self._stop = None, False
        shutil.rmtree(self.spool, ignore_errors=True)
        self.wait_seconds += time.perf_counter() - begin

    def on_train_end(self, trainer: Any) -> None:
        super().on_train_end(trainer)
        self.wait()
        try:
            tr.log_metrics(self.tracking, self.run_id, {
                "checkpoints_logged": self.logged, "time_checkpoint_seconds": self.seconds,
                "time_checkpoint_wait_seconds": self.wait_seconds})
        except Exception as exc:  # noqa: BLE001 - never hide the training's own outcome
            _log.warning("checkpoint metrics not logged: %s", tr.failure_reason(exc))


# ------------------------------------------------------------------------------------------------ resuming


@dataclass
class ResumePoint:
    folder: str  # the local checkpoint folder handed to fit(resume_from=...)
    source: str  # what it came from: an artifact URI or a local path
    run_id: str | None  # the run that wrote it, when known
    epoch: int | None  # the epochs it holds


def checkpoint_uri(resume_from: str) -> str | None:
    """The artifact URI ``resume_from`` names, or None for a local folder.

    ``<run id>`` and ``runs:/<run id>`` mean that run's ``checkpoint/``.
    """
    text = str(resume_from).strip()
    match = _RUNS_URI.match(text)
    if match:
        return f"runs:/{match.group(1)}/{match.group(2).rstrip('/') or ARTIFACT_PATH}"
    if "://" in text:
        return text.rstrip("/")
    if _RUN_ID.match(text) and not Path(text).exists():
        return f"runs:/{text.lower()}/{ARTIFACT_PATH}"
    return None


def _download(uri: str, dest: Path, tracking_uri: str) -> Path | None:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    try:
        return download_artifacts(artifact_uri=uri, dst_path=dest, tracking_uri=tracking_uri)
    except Exception as exc:  # noqa: BLE001 - "nothing there" has many shapes across artifact stores
        _log.debug("no artifacts at %s: %s", uri, exc)
        return None


def resolve(tracking: tr.Tracking, resume_from: str | None, dest: Path) -> ResumePoint | None:
    """Download (when needed) and check the checkpoint ``resume_from`` names; None when it is empty."""
    if not resume_from:
        return None
    uri = checkpoint_uri(resume_from)
    if uri is None:
        folder = Path(str(resume_from)).expanduser().resolve()
        state = check_folder(folder)
        if state in ("missing", "torn"):
            raise CheckpointError(f"trainer.resume_from={str(resume_from)!r}: {folder} holds no complete ortflow "
                                  f"checkpoint ({state})")
        try:  # a local folder needs no manifest of ours, but ortflow's trainer.json must match its checksum
            read_manifest(folder)
        except CheckpointError as exc:
            raise CheckpointError(f"trainer.resume_from={str(resume_from)!r}: {exc}") from exc
        return ResumePoint(str(folder), str(folder), None, checkpoint_epoch(folder))
    match = _RUNS_URI.match(uri)
    run_id = match.group(1) if match else None
    if run_id:
        try:
            tracking.client.get_run(run_id)
        except Exception as exc:  # noqa: BLE001 - reported with what was asked for
            raise CheckpointError(f"trainer.resume_from={str(resume_from)!r}: no run {run_id} in the tracking "
                                  f"store {tracking.uri} ({str(exc).splitlines()[0][:200]})") from exc
    primary = _download(uri, dest / "primary", tracking.uri)
    state = check_folder(primary) if primary else "missing"
    if state == "ok":  # a logged copy without its manifest ("unverified") is not trusted
        return ResumePoint(str(primary), uri, run_id, checkpoint_epoch(primary))
    backup_uri = uri + BACKUP_SUFFIX
    backup = _download(backup_uri, dest / "backup", tracking.uri)
    if backup is not None and check_folder(backup) == "ok":
        _log.warning("%s is %s (its run was killed while logging it): resuming from %s instead", uri, state,
                     backup_uri)
        return ResumePoint(str(backup), backup_uri, run_id, checkpoint_epoch(backup))
    hint = (f" Run {run_id} logged no checkpoint: it was stopped before its first one, or ran without "
            "trainer.checkpoint_every" if state == "missing" and run_id else "")
    if state == "unverified":
        hint = f" A logged checkpoint without its {MANIFEST} (sha256 of its files) is not trusted."
    raise CheckpointError(f"trainer.resume_from={str(resume_from)!r}: no complete checkpoint at {uri} "
                          f"({state}) nor at {backup_uri}.{hint}")


def config_changes(source_params: dict[str, str], cfg: DictConfig) -> list[str]:
    """Settings of ``cfg`` that differ from the run being resumed (those that change the training's result)."""
    current = {k: (json.dumps(v) if isinstance(v, (list, dict)) else str(v))[:tr.MAX_PARAM_LENGTH]
               for k, v in tr.flatten(to_container(cfg)).items()}
    return sorted(f"{key}: {source_params[key]} -> {value}" for key, value in current.items()
                  if key.startswith(_COMPARED) and key not in _FREE_KEYS and key in source_params
                  and source_params[key] != value)


#: settings a checkpoint cannot be carried to: its weights' shapes and its optimizer's state depend on them
_BOUND_KEYS = ("trainer.name", "trainer.optimizer", "model.name", "model.hidden_layer_sizes")


def check_resumable(tracking: tr.Tracking, cfg: DictConfig) -> None:
    """Before any stage runs: refuse ``trainer.resume_from`` naming a run trained with another trainer, optimizer
    or model (its checkpoint cannot be restored into this one: seen as a KeyError after two stages had run), naming
    each difference. A local folder, or a run the store does not hold, is left to the train stage's checks."""
    resume_from = cfg.trainer.get("resume_from")
    match = _RUNS_URI.match(checkpoint_uri(str(resume_from)) or "") if resume_from else None
    if match is None:
        return
    try:
        params = tracking.client.get_run(match.group(1)).data.params
    except Exception as exc:  # noqa: BLE001 - resolve() names a missing run, in the train stage
        _log.debug("could not read the params of run %s: %s", match.group(1), exc)
        return
    bound = [change for change in config_changes(params, cfg) if change.split(":")[0] in _BOUND_KEYS]
    if bound:
        raise CheckpointError(_bound_message(resume_from, match.group(1), bound))


def _bound_message(resume_from, run_id: str, bound: list[str]) -> str:
    return (f"trainer.resume_from={str(resume_from)!r}: run {run_id} trained with other settings, which its "
            f"checkpoint cannot be restored into: {'; '.join(bound)}; resume with that run's settings, or train "
            "from the start without trainer.resume_from")


def resume_point(ctx) -> ResumePoint | None:
    """The checkpoint ``trainer.resume_from`` names, downloaded into the work dir; tags the stage's run."""
    point = resolve(ctx.tracking, ctx.cfg.trainer.resume_from, ctx.work_dir / "resume_from")
    if point is None:
        return None
    tags = {RESUMED_FROM_TAG: point.source, RESUMED_FROM_RUN_TAG: point.run_id, RESUMED_FROM_EPOCH_TAG: point.epoch}
    ctx.set_tags(tags)
    if point.run_id and point.run_id != ctx.run_id:
        try:
            changes = config_changes(ctx.tracking.client.get_run(point.run_id).data.params, ctx.cfg)
        except Exception as exc:  # noqa: BLE001 - only a check
            changes = []
            _log.debug("could not read the params of run %s: %s", point.run_id, exc)
        bound = [change for change in changes if change.split(":")[0] in _BOUND_KEYS]
        if bound:  # a stage run alone: refused before fit, as the chain refuses before its first stage
            raise CheckpointError(_bound_message(ctx.cfg.trainer.resume_from, point.run_id, bound))
        if changes:
            _log.warning("resuming run %s with other settings: the result will differ from an uninterrupted "
                         "run: %s", point.run_id, "; ".join(changes))
    return point


def mark_resumed(tracking: tr.Tracking, source_run_id: str, run_id: str) -> list[str]:
    """End ``source_run_id`` as KILLED, tagged with the run resuming it, if it is still RUNNING.

    A process killed inside ``python -m pipelines.main`` also left its chain's parent run RUNNING: that parent
    (``ortflow.pipeline=main``) is ended the same way, unless it is the resuming run's own parent.
    Returns the ids of the runs it ended.
    """
    source = tracking.client.get_run(source_run_id)
    if source.info.status != "RUNNING" or source_run_id == run_id:
        return []
    if tr.is_alive(source):  # RUNNING because it runs: two trainings now go on from the same checkpoint
        tags = source.data.tags
        _log.warning("run %s is still alive (pid %s on %s): not marked KILLED", source_run_id, tags.get(tr.PID_TAG),
                     tags.get(tr.HOST_TAG))
        return []
    marked = [source_run_id]
    parent_id = source.data.tags.get(MLFLOW_PARENT_RUN_ID)
    if parent_id and parent_id != tracking.client.get_run(run_id).data.tags.get(MLFLOW_PARENT_RUN_ID):
        parent = tracking.client.get_run(parent_id)
        if parent.info.status == "RUNNING" and parent.data.tags.get("ortflow.pipeline") == "main":
            marked.append(parent_id)
    for killed in marked:
        tracking.client.set_tag(killed, RESUMED_BY_TAG, run_id)
        tracking.client.set_terminated(killed, "KILLED")
    return marked


class MarkResumed(Callback):
    """Once the checkpoint is restored (training begins), mark the run that wrote it (see :func:`mark_resumed`)."""

    def __init__(self, tracking: tr.Tracking, source_run_id: str, run_id: str):
        self.tracking = tracking
        self.source_run_id = source_run_id
        self.run_id = run_id
        self.marked: list[str] = []

    def on_train_begin(self, trainer: Any) -> None:
        try:
            self.marked = mark_resumed(self.tracking, self.source_run_id, self.run_id)
        except Exception as exc:  # noqa: BLE001 - bookkeeping of another run must not stop this one
            _log.warning("could not mark run %s as resumed by %s: %s", self.source_run_id, self.run_id,
                         tr.failure_reason(exc))
        if self.marked:
            print(f"ortflow: run(s) {', '.join(self.marked)} still RUNNING (their process died): marked KILLED, "
                  f"resumed by run {self.run_id}")
