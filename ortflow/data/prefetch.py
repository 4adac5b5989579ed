"""Reading ahead: the next items of an iterator are produced on a background thread while the consumer works.

A streamed epoch reads and converts its next chunks (Parquet row groups decoded, columns mapped to the graph's
inputs, the frozen prefix run) while onnxruntime trains on the current one; both release the GIL in their heavy
parts, so the two overlap. An exception in the reader is raised in the consumer with its traceback; closing the
prefetcher (or leaving a ``with`` block, or a generator using it being closed) stops the thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator

_DONE = object()


class Prefetcher:
    """Iterate over ``iterable`` with up to ``depth`` items produced ahead on a daemon thread."""

    def __init__(self, iterable: Iterable, depth: int = 2):
        if depth < 1:
            raise ValueError(f"depth={depth!r} must be a positive integer")
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(iter(iterable),), name="ortflow-prefetch",
                                        daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, iterator: Iterator) -> None:
        try:
            for item in iterator:
                if not self._put((item, None)):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            self._put((None, exc))
            return
        finally:
            close = getattr(iterator, "close", None)
            if close is not None and self._stop.is_set():
                close()
        self._put((_DONE, None))

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self):
        if self._stop.is_set():
            raise StopIteration
        item, exc = self._queue.get()
        if exc is not None:
            self.close()
            raise exc
        if item is _DONE:
            self.close()
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop the reader thread (items read ahead are dropped)."""
        self._stop.set()
        while True:  # unblock a reader waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
