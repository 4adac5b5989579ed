"""SHA-256 of files and folders written atomically: what training packages and library checkpoints
(:mod:`ortflow.trainers.checkpoint`) share.

:func:`write_folder` writes a folder's files into a temporary folder beside it and moves it into place once
complete: a reader sees the old folder or the new one, never a mix; a failed write leaves the old one as it was.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

#: the block read at a time when hashing a file
_BLOCK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of the file at ``path``, read by blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def file_digests(folder: Path, files: Iterable[Path]) -> dict[str, str]:
    """A manifest's ``files``: the SHA-256 of each of ``files`` (inside ``folder``) by its path relative to it."""
    return {p.relative_to(folder).as_posix(): sha256(p) for p in files}


def first_mismatch(folder: Path, digests: dict[str, str]) -> tuple[str, str] | None:
    """The first file of a manifest's ``digests`` that is not there as listed: ``(name, 'missing')`` or ``(name,
    'changed')``; None when every file matches its checksum."""
    for name, digest in digests.items():
        file = folder / name
        if not file.is_file():
            return name, "missing"
        if sha256(file) != digest:
            return name, "changed"
    return None


def write_folder(folder: str | os.PathLike, fill: Callable[[Path], None]) -> Path:
    """Call ``fill(tmp)`` to write the files of ``folder`` into a new temporary folder beside it, then replace
    ``folder`` by it (renames in one file system). On any error the temporary folder goes and ``folder`` is kept
    unchanged. Returns ``folder``."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        fill(tmp)
        if folder.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}-old-", dir=folder.parent))
            old.rmdir()
            folder.rename(old)
            tmp.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
