"""Library checkpoints: a folder written atomically, every file listed with its SHA-256 in ``trainer.json``.

``trainer.json`` (the manifest: epoch, history, random state, the files' checksums) carries the SHA-256 of its own
content (``"sha256"``, over the canonical JSON of every other key), so every byte a resume reads is verified. A
checkpoint is trusted only when its manifest reads and matches its own checksum, every listed file is there with
its checksum, and it was written by the same trainer class for the same graph and weights (a fingerprint): a
flipped bit (in the state or in the manifest), a truncated file or another model's checkpoint is a
:class:`~ortflow.exceptions.CheckpointError` naming the file or what is wrong. A manifest without its own checksum
(written before ortflow checksummed it) is not trusted either.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .exceptions import CheckpointError

META = "trainer.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(model_bytes: bytes, weights: list[str]) -> str:
    """What a checkpoint must have been written for: the graph and the names of the trained weights."""
    digest = hashlib.sha256(model_bytes)
    digest.update(json.dumps(sorted(weights)).encode())
    return digest.hexdigest()


def write(folder: str | os.PathLike, save_state: Callable[[str], None], meta: dict[str, Any]) -> str:
    """Write ``save_state(tmp_folder)``'s files and ``meta`` (plus the file checksums) into ``folder``, replaced
    atomically: a reader sees the old checkpoint or the new one, never a mix."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_state(str(tmp))
        files = {p.name: sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        body = {**meta, "files": files}
        (tmp / META).write_text(json.dumps({**body, "sha256": _digest(body)}))
    except OSError as exc:  # a full disk: the partial files go, the previous checkpoint stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(exc.errno, f"checkpoint {folder} not written ({exc.strerror or exc}); the previous checkpoint "
                                 "there, if any, is kept unchanged") from exc
    old = folder.with_name(folder.name + ".old")
    if folder.exists():
        shutil.rmtree(old, ignore_errors=True)
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
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
    for name, digest in files.items():
        file = folder / name
        if not file.is_file():
            raise CheckpointError(f"resume_from={str(folder)!r}: {name} is missing")
        if sha256(file) != digest:
            raise CheckpointError(f"resume_from={str(folder)!r}: {name} does not match its checksum (corrupt or "
                                  "truncated); the checkpoint is not trusted")
    return meta


def load_arrays(folder: str | os.PathLike, file: str, what: str) -> dict[str, np.ndarray]:
    """The arrays of the runtime-state file ``file`` in ``folder`` (``what`` says whose state it is, for the
    error when the file is missing)."""
    path = os.path.join(folder, file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{str(folder)!r} holds no {what} ({file})")
    with np.load(path, allow_pickle=False) as stored:
        return {k: stored[k] for k in stored.files}

