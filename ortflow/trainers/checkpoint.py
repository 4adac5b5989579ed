"""Library checkpoints: a folder written atomically, every file listed with its SHA-256 in ``trainer.json``.

``trainer.json`` (the manifest: epoch, history, random state, the files' checksums) carries the SHA-256 of its own
content (``"sha256"``, over the canonical JSON of every other key), so every byte a resume reads is verified. A
checkpoint is trusted only when its manifest reads and matches its own checksum, every listed file is there with
its checksum, and it was written by the same trainer class for the same graph and weights (a fingerprint): a
flipped bit (in the state or in the manifest), a truncated file or another model's checkpoint is a
:class:`~ortflow.exceptions.CheckpointError` naming the file or what is wrong. A manifest without its own checksum
(written before ortflow checksummed it) is not trusted either.

:class:`CheckpointMixin` gives the trainers ``save_checkpoint`` and the resume of ``fit(..., resume_from=...)``: an
epoch boundary, or, in a streamed fit, a chunk boundary inside an epoch (:class:`Progress`: the chunks and rows
trained, the random state the epoch's order comes from, its batch losses so far).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..exceptions import CheckpointError
from ..package.folder import file_digests, first_mismatch, write_folder

META = "trainer.json"


def fingerprint(model_bytes: bytes, weights: list[str]) -> str:
    """What a checkpoint must have been written for: the graph and the names of the trained weights."""
    digest = hashlib.sha256(model_bytes)
    digest.update(json.dumps(sorted(weights)).encode())
    return digest.hexdigest()


def write(folder: str | os.PathLike, save_state: Callable[[str], None], meta: dict[str, Any]) -> str:
    """Write ``save_state(tmp_folder)``'s files and ``meta`` (plus the file checksums) into ``folder``, replaced
    atomically (:func:`ortflow.package.folder.write_folder`): a reader sees the old checkpoint or the new one, never
    a mix."""
    def fill(tmp: Path) -> None:
        save_state(str(tmp))
        files = file_digests(tmp, [p for p in sorted(tmp.iterdir()) if p.is_file()])
        body = {**meta, "files": files}
        (tmp / META).write_text(json.dumps({**body, "sha256": _digest(body)}))

    try:
        write_folder(folder, fill)
    except OSError as exc:  # a full disk: the partial files go, the previous checkpoint stays
        raise OSError(exc.errno, f"checkpoint {folder} not written ({exc.strerror or exc}); the previous checkpoint "
                                 "there, if any, is kept unchanged") from exc
    return str(folder)


def _digest(body: dict[str, Any]) -> str:
    """SHA-256 of the manifest's content: its canonical JSON (sorted keys), which reads back to the same text."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """``trainer.json`` of the checkpoint in ``folder`` once it matches its own checksum (the files it lists are
    not checked: :func:`read` does)."""
    folder = Path(folder)
    path = folder / META
    if not path.is_file():
        raise FileNotFoundError(f"resume_from={str(folder)!r} holds no ortflow checkpoint ({META})")
    try:
        meta = json.loads(path.read_text())
        digest = meta.pop("sha256", None)
        files, written_by = meta["files"], meta["trainer"]
        if not isinstance(files, dict) or not isinstance(written_by, str):
            raise TypeError(f"files is a {type(files).__name__}, trainer a {type(written_by).__name__}")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError) as exc:
        raise CheckpointError(f"resume_from={str(folder)!r}: {META} is unreadable or has no file checksums "
                              f"({type(exc).__name__}: {exc}); the checkpoint is not trusted") from exc
    if digest is None:
        raise CheckpointError(f"resume_from={str(folder)!r}: {META} has no checksum of its own (written by an "
                              "older ortflow, or edited): its epoch, history and random state cannot be verified; "
                              "the checkpoint is not trusted")
    if digest != _digest(meta):
        raise CheckpointError(f"resume_from={str(folder)!r}: {META} does not match its checksum (corrupt or "
                              "edited: its epoch, history or random state changed); the checkpoint is not trusted")
    return meta


def read(folder: str | os.PathLike, trainer: str, expected_fingerprint: str) -> dict[str, Any]:
    """The manifest of the checkpoint in ``folder`` once every check passed."""
    folder = Path(folder)
    meta = read_manifest(folder)
    files, written_by = meta["files"], meta["trainer"]
    if written_by != trainer:
        raise CheckpointError(f"resume_from={str(folder)!r} was written by {written_by}, not {trainer}")
    if meta.get("fingerprint") != expected_fingerprint:
        raise CheckpointError(f"resume_from={str(folder)!r} was written for another graph or other weights to "
                              "train: resume with the model_onnx and weights_to_train it was trained with")
    mismatch = first_mismatch(folder, files)
    if mismatch is not None:
        name, why = mismatch
        if why == "missing":
            raise CheckpointError(f"resume_from={str(folder)!r}: {name} is missing")
        raise CheckpointError(f"resume_from={str(folder)!r}: {name} does not match its checksum (corrupt or "
                              "truncated); the checkpoint is not trusted")
    return meta


def save_state(folder: str | os.PathLike, file: str, weights: dict[str, np.ndarray],
               optimizer_state: dict[str, np.ndarray]) -> None:
    """A trainer's runtime state in ``folder``/``file``, the one layout of every trainer: its weights
    (``weight:<name>``) and its optimizer's state (``state:<key>``, the keys of
    :meth:`ortflow.trainers.base.BaseTrainer.get_optimizer_state`)."""
    arrays = {f"weight:{k}": v for k, v in weights.items()}
    arrays.update({f"state:{k}": np.asarray(v) for k, v in optimizer_state.items()})
    np.savez(os.path.join(folder, file), **arrays)


def load_state(folder: str | os.PathLike, file: str, what: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(weights, optimizer state)`` as :func:`save_state` wrote them (``what`` names the trainer's state in the
    error when the file is missing)."""
    stored = load_arrays(folder, file, what)
    weights = {k[len("weight:"):]: v.astype(np.float32) for k, v in stored.items() if k.startswith("weight:")}
    state = {k[len("state:"):]: v for k, v in stored.items() if k.startswith("state:")}
    return weights, state


def load_arrays(folder: str | os.PathLike, file: str, what: str) -> dict[str, np.ndarray]:
    """The arrays of the runtime-state file ``file`` in ``folder`` (``what`` says whose state it is, for the
    error when the file is missing)."""
    path = os.path.join(folder, file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{str(folder)!r} holds no {what} ({file})")
    with np.load(path, allow_pickle=False) as stored:
        return {k: stored[k] for k in stored.files}


#: the file of a mid-epoch checkpoint holding the epoch's batch losses and sizes so far
EPOCH_LOSSES = "epoch_losses.npz"


@dataclass(frozen=True)
class StreamPosition:
    """Where a streamed fit stands at a chunk boundary, handed to :meth:`Callback.on_chunk_end`: ``epoch`` (the
    epoch in progress, 1-based as in its record), the ``chunks`` and ``rows`` of it trained so far."""

    epoch: int
    chunks: int
    rows: int


class Progress:
    """A streamed epoch's progress: the batch losses and sizes so far, the chunks and rows trained, and what the
    epoch started from (random state, samples seen before it), with the source's identity: what a mid-epoch
    checkpoint holds. ``epoch`` is 0-based."""

    def __init__(self, epoch: int, source: dict, rng_state, samples_seen: int, chunks: int = 0, rows: int = 0,
                 losses=None, sizes=None, elapsed: float = 0.0):
        self.epoch, self.source, self.rng_state, self.samples_seen = epoch, source, rng_state, int(samples_seen)
        self.chunks, self.rows, self.elapsed = chunks, rows, elapsed
        self.losses, self.sizes = losses or [np.empty(0)], sizes or [np.empty(0)]
        self.begin = 0.0  # the epoch's start (time.perf_counter, less the elapsed time before a resume)

    def position(self) -> StreamPosition:
        return StreamPosition(self.epoch + 1, self.chunks, self.rows)

    def batches(self, batch_size: int) -> dict[str, np.ndarray]:
        """The batch losses so far and, of their sizes, those of the batches shorter than ``batch_size`` (one per
        chunk at most): 8 bytes a batch, not 16."""
        sizes = np.concatenate(self.sizes)
        short = np.flatnonzero(sizes != batch_size)
        return {"losses": np.concatenate(self.losses), "short": short, "short_sizes": sizes[short]}

    def record(self) -> dict:
        """The manifest's ``position`` in the epoch after its ``epoch`` complete ones (the losses go to their own
        file)."""
        return {"chunks": self.chunks, "rows": self.rows, "samples_seen": self.samples_seen,
                "elapsed": time.perf_counter() - self.begin, "source": self.source}


class CheckpointMixin:
    """``save_checkpoint`` and the restore of ``resume_from`` for :class:`ortflow.trainers.base.BaseTrainer`, through its
    ``_save_runtime_state`` / ``_load_runtime_state`` hooks."""

    def save_checkpoint(self, folder: str | os.PathLike) -> str:
        """Write weights, optimizer state, history and random state to ``folder`` (replaced atomically, every file
        checksummed). It holds an epoch boundary, or, called from a callback's ``on_chunk_end`` during a streamed
        fit, a chunk boundary inside an epoch: the position (chunks and rows trained), the random state at the
        epoch's start (the source's order is replayed from it), the samples seen before it, the source's identity
        and the batch losses so far (``epoch_losses.npz``). Refused anywhere else in the middle of an epoch."""
        self._check_fitted()
        at = getattr(self, "_at_chunk", None)
        if getattr(self, "in_epoch_", False) and at is None:
            raise RuntimeError("save_checkpoint in the middle of an epoch (training was interrupted): the weights "
                               "are not those of a completed epoch; the last checkpoint written stays valid")
        rng_state = getattr(self, "_rng_state", None) if at is None else at.rng_state
        meta = {
            "trainer": type(self).__name__,
            "fingerprint": self._fingerprint(),
            "epoch": len(self.history_),
            "history": self.history_,
            "rng_state": None if rng_state is None else [rng_state[0], rng_state[1].tolist(), *rng_state[2:]],
        }
        if at is None:
            if getattr(self, "_next_seen", None) is not None:
                meta["samples_seen"] = self._next_seen
            return write(folder, self._save_runtime_state, meta)
        meta["position"] = {**at.record(), "batch_size": int(self.batch_size), "shuffle": bool(self.shuffle)}

        def save_state(tmp: str) -> None:
            self._save_runtime_state(tmp)
            np.savez(os.path.join(tmp, EPOCH_LOSSES), **at.batches(self.batch_size))

        return write(folder, save_state, meta)

    def _fingerprint(self) -> str:
        return fingerprint(self._model.SerializeToString(), self.weights_to_train_)

    def _restore_checkpoint(self, folder, rng, streamed=None):
        """The checkpoint in ``folder`` restored (``rng`` set to its random state). One written inside a streamed
        epoch is refused unless this fit streams the same source with the same batches; a streamed fit resuming a
        stream's checkpoint keeps in ``_resumed_progress`` what its next epoch continues: the samples seen before
        it (a source may not know its rows) and, inside an epoch, the position and batch losses."""
        meta = read(folder, type(self).__name__, self._fingerprint())
        position = meta.get("position")
        if position is not None:
            self._resumed_progress = self._check_position(folder, meta["epoch"], position, streamed)
        elif streamed is not None and meta.get("samples_seen") is not None:  # a stream's epoch boundary
            self._resumed_progress = Progress(meta["epoch"], streamed, None, meta["samples_seen"])
        self._load_runtime_state(str(folder))
        self.history_ = []
        self._append(None)
        for record in meta["history"]:
            self._append(record)
        if meta["rng_state"] is not None:
            name, keys, *rest = meta["rng_state"]
            rng.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
        if self._resumed_progress is not None:
            self._resumed_progress.rng_state = rng.get_state()
        return rng

    def _check_position(self, folder, epoch: int, position: dict, streamed: dict | None) -> Progress:
        """The progress of the epoch a mid-epoch checkpoint stopped in (after ``epoch`` complete ones), once this
        fit can continue it."""
        where = (f"resume_from={str(folder)!r} stopped inside epoch {epoch + 1} of a streamed fit "
                 f"({position['rows']} rows trained)")
        if streamed is None:
            raise CheckpointError(f"{where}: an in-memory fit cannot continue it; resume with fit(source, "
                                  "resume_from=...) on the source it streamed")
        now = {"source": streamed, "batch_size": int(self.batch_size), "shuffle": bool(self.shuffle)}
        for key, value in now.items():
            if position.get(key) != value:
                if key == "source":
                    before = position.get(key) or {}
                    detail = "; ".join(f"{k}: {before.get(k)!r} then, {value.get(k)!r} now"
                                       for k in sorted({*before, *value}) if before.get(k) != value.get(k))
                    raise CheckpointError(f"{where} of another source ({detail}): its order and rows would differ; "
                                          "resume on the source it streamed")
                raise CheckpointError(f"{where} with {key}={position.get(key)!r}, not {value!r}: the epoch's "
                                      f"batches would differ; resume with {key}={position.get(key)!r}")
        stored = load_arrays(folder, EPOCH_LOSSES, "batch losses of the interrupted epoch")
        sizes = np.full(len(stored["losses"]), float(self.batch_size))
        sizes[stored["short"]] = stored["short_sizes"]
        return Progress(epoch, streamed, None, position["samples_seen"], position["chunks"],
                         position["rows"], [stored["losses"]], [sizes], position["elapsed"])
