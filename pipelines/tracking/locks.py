"""Locks between the processes of one machine sharing a local sqlite store (schema creation, promotion, a shared
Optuna study): a file lock next to the database."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


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
