"""Work repeated in the background while a block runs: the heartbeats of MLflow runs and of Optuna trials."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Callable


@contextlib.contextmanager
def every(seconds: float, action: Callable[[], None], name: str) -> Iterator[None]:
    """Call ``action`` every ``seconds`` from a daemon thread named ``name`` while the body runs. A call that
    raises is skipped (a missed beat only makes the work look older). The body's end stops the loop without
    waiting for a call in progress (one may hang on an unreachable server)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(seconds):
            with contextlib.suppress(Exception):
                action()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
