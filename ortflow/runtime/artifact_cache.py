"""Process-wide, bounded caches of what full training builds from a graph, so that fitting the same graph again
(clones in a GridSearchCV, repeated fits) does not build it again.

- :data:`TRAINING_ARTIFACTS`: onnxruntime's generated artifacts (bytes); each fit builds its own sessions and
  checkpoint state from them.
- :data:`STEP_GRAPHS`: ortflow's own training-step graphs and their sessions (:mod:`ortflow.engines.full_step`). A
  session holds no training state (weights and moments are bound buffers of each fit), so fits share it safely.

Entries are keyed by everything they are built from (the graph's bytes, the weights trained, the optimizer and
its settings, the device, the threads). Least recently used entries go first once ``max_entries`` or
``max_bytes`` is exceeded.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any


class ArtifactCache:
    """LRU mapping key -> entry (by default a dict of name -> bytes), bounded by entry count and by total bytes
    (``sizeof(entry)``)."""

    def __init__(self, max_entries: int = 32, max_bytes: int = 256 * 2**20,
                 sizeof: Callable[[Any], int] | None = None):
        self.max_entries = int(max_entries)
        self.max_bytes = int(max_bytes)
        self.sizeof = sizeof or _size
        self._entries: OrderedDict[str, dict[str, bytes]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(graph: bytes, *settings: Iterable | str | None) -> str:
        """A digest of ``graph`` and the ``settings`` (their ``repr``)."""
        digest = hashlib.sha256(graph)
        for setting in settings:
            digest.update(b"\0" + repr(setting).encode())
        return digest.hexdigest()

    def get(self, key: str) -> Any:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: str, entry: Any) -> None:
        """Store ``entry`` (an entry larger than ``max_bytes`` is not kept), then evict down to the bounds."""
        if self.sizeof(entry) > self.max_bytes or self.max_entries <= 0:
            return
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries or self.nbytes > self.max_bytes:
                self._entries.popitem(last=False)

    @property
    def nbytes(self) -> int:
        return sum(self.sizeof(e) for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every entry and reset the counters."""
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0


def _size(entry: dict[str, bytes]) -> int:
    return sum(len(v) for v in entry.values())


#: onnxruntime's artifacts for ``gradients='onnxruntime'`` (``TRAINING_ARTIFACTS.clear()`` empties it)
TRAINING_ARTIFACTS = ArtifactCache()
#: ortflow's step graphs: (graph, OnnxFunction or None) entries, sized by the graph (``STEP_GRAPHS.clear()``)
STEP_GRAPHS = ArtifactCache(max_entries=32, sizeof=lambda entry: entry[0].ByteSize())
