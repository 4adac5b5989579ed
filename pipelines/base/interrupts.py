"""Signals: SIGTERM handled like Ctrl-C, and store writes that finish before either takes effect.

:func:`terminate_as_interrupt` (around every command's body) makes SIGTERM raise :class:`Terminated` (a
KeyboardInterrupt) in the main thread, so that runs end KILLED with the reason instead of staying RUNNING.
Inside :func:`deferred` (a tracking-store call, the creation of a run, the registration of a version) a signal
waits for the block's end: an sqlite transaction is committed or rolled back by its own code instead of being left
open, holding the database's lock against this very process's next write (which the retries of
:mod:`pipelines.tracking.retries` would take for another writer's). A second signal while one waits is raised at
once. A block lasts at most one store call (sqlite's busy timeout), so a signal ends the command within seconds.

:func:`pause_point` is a test hook: ``ORTFLOW_TEST_PAUSE=<point>`` makes the process stop once at ``<point>``
(``after_register``: right after a version is registered; ``sqlite_write``: inside the first metric insert of an
sqlite store's transaction; ``import_states``: after the states are read), write ``<point>`` to the file
``ORTFLOW_TEST_PAUSE_FILE`` and wait (at most :data:`PAUSE_SECONDS`) for a signal: the tests send one there.

This module imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

#: the test hook's environment variables (see the module's docstring)
PAUSE_ENV, PAUSE_FILE_ENV = "ORTFLOW_TEST_PAUSE", "ORTFLOW_TEST_PAUSE_FILE"
#: the longest a test pause waits for its signal
PAUSE_SECONDS = 60.0

# depth of the deferred blocks the main thread is in, the signal waiting for their end, the points paused at
_state: dict = {"depth": 0, "pending": None, "installed": False, "paused": set()}


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a scheduler's time limit, ``docker stop``) received: handled like Ctrl-C, so the runs
    end KILLED with the reason instead of staying RUNNING."""


def interruption(signum: int) -> KeyboardInterrupt:
    """The exception signal ``signum`` raises: KeyboardInterrupt for SIGINT, :class:`Terminated` otherwise."""
    if signum == signal.SIGINT:
        return KeyboardInterrupt()
    return Terminated(f"signal {signal.Signals(signum).name} received")


def _handler(signum: int, frame: object) -> None:
    if _state["depth"] and _state["pending"] is None:
        _state["pending"] = signum  # raised when the deferred block ends
        return
    _state["pending"] = None
    raise interruption(signum)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While the body runs, SIGTERM raises :class:`Terminated` and SIGINT KeyboardInterrupt in the main thread,
    both held back inside :func:`deferred` blocks. Elsewhere than in the main thread: nothing changes."""
    if threading.current_thread() is not threading.main_thread() or _state["installed"]:
        yield
        return
    previous = {s: signal.signal(s, _handler) for s in (signal.SIGTERM, signal.SIGINT)}
    _state["installed"] = True
    try:
        yield
    finally:
        _state["installed"] = False
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def deferred(raise_at_end: bool = True) -> Iterator[None]:
    """A block that a signal does not cut (see the module's docstring): a signal received inside it is raised
    when the outermost block ends (with ``raise_at_end=False``, by the next :func:`raise_pending`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
        if raise_at_end:
            raise_pending()


def pending() -> bool:
    """Whether a signal waits for the end of a deferred block (retries stop: the block must end soon)."""
    return _state["pending"] is not None


def raise_pending() -> None:
    """Raise the signal that waited for a deferred block, if any (outside every block)."""
    signum = _state["pending"]
    if signum is not None and not _state["depth"]:
        _state["pending"] = None
        raise interruption(signum)


def pause_point(point: str) -> None:
    """Test hook (see the module's docstring): stop here once when ``ORTFLOW_TEST_PAUSE=<point>``."""
    if os.environ.get(PAUSE_ENV) != point or point in _state["paused"]:
        return
    _state["paused"].add(point)
    marker = os.environ.get(PAUSE_FILE_ENV)
    if marker:
        Path(marker).write_text(point)
    end = time.monotonic() + PAUSE_SECONDS
    while time.monotonic() < end and _state["pending"] is None:
        time.sleep(0.02)
