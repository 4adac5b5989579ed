"""The state-file codec: a package's state tensors and progress as the bytes every runtime reads and writes.

A state file is ``b"OFTS"`` (:data:`~ortflow.package.format.STATE_MAGIC`), a uint32 little-endian header length
``H``, ``H`` bytes of UTF-8 JSON (:class:`~ortflow.package.format.StateHeader`: format, version, the package's id,
the tensor table, ``epochs``, ``steps``, ``rows_seen``, ``rows``; padded with spaces to a multiple of 4 bytes), then
the float32 little-endian values laid out as the table says, and nothing after them. A file is read header first:
its 8 bytes, then the header, checked, then exactly the data the table announces (a file of another size is
refused before its data is read).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..exceptions import TrainingPackageError
from .format import MAX_HEADER, STATE_MAGIC, StateHeader, StateTensor


def strict_json(text: bytes | str, what: str):
    """JSON without a key given twice (the last would win silently). NaN and Infinity are read as numbers: the
    records refuse them naming their field."""
    def pairs(items):
        seen = {}
        for key, value in items:
            if key in seen:
                raise TrainingPackageError(f"{what}: the key {key!r} is given twice")
            seen[key] = value
        return seen

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except (ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, TrainingPackageError):
            raise
        raise TrainingPackageError(f"{what} is not readable JSON: {exc}") from exc


def encode_state(header: StateHeader, tensors: Sequence[np.ndarray]) -> bytes:
    """The state file of ``header`` (its table's offsets and lengths rewritten from ``tensors``, in order)."""
    chunks, offset = [], 0
    for entry, array in zip(header.tensors, tensors, strict=True):
        array = np.ascontiguousarray(array, dtype="<f4")
        entry.shape, entry.offset, entry.length = list(array.shape), offset, int(array.size)
        chunks.append(array.tobytes())
        offset += array.nbytes
    text = json.dumps(header.to_json(), allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 4)
    return STATE_MAGIC + struct.pack("<I", len(text)) + text + b"".join(chunks)


def _data_bytes(header: StateHeader) -> int:
    return sum(4 * t.length for t in header.tensors)


def read_state(source: bytes | bytearray | memoryview | str | os.PathLike, what: str) -> tuple[StateHeader, bytes]:
    """The header and the data bytes of the state file ``source`` (bytes, or a path read header first)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = memoryview(source)
        head, size = bytes(data[:8]), len(data)
        read = lambda start, count: bytes(data[start: start + count])  # noqa: E731
        return _read(head, size, read, what)
    path = Path(source)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size

            def read(start: int, count: int) -> bytes:
                f.seek(start)
                return f.read(count)

            return _read(f.read(8), size, read, what)
    except OSError as exc:
        raise TrainingPackageError(f"{what} cannot be read: {exc}") from exc


def _read(head: bytes, size: int, read, what: str) -> tuple[StateHeader, bytes]:
    if len(head) < 8 or head[:4] != STATE_MAGIC:
        raise TrainingPackageError(f"{what} is not an ortflow training state (it does not start with {STATE_MAGIC!r})")
    (length,) = struct.unpack("<I", head[4:8])
    if length > min(MAX_HEADER, size - 8):
        raise TrainingPackageError(f"{what}: its header length {length} runs past the file ({size} bytes) or the "
                                   f"limit of {MAX_HEADER} bytes")
    raw = strict_json(read(8, length), f"{what}'s header")
    try:
        header = StateHeader.from_json(raw)
    except TrainingPackageError as exc:
        raise TrainingPackageError(f"{what}'s header: {exc}") from None
    expected = _data_bytes(header)
    if size != 8 + length + expected:
        extra = size - 8 - length - expected
        raise TrainingPackageError(f"{what}: its table announces {expected} bytes of values, the file holds "
                                   f"{size - 8 - length} ({'trailing bytes' if extra > 0 else 'truncated'})")
    return header, read(8 + length, expected)


def decode_tensors(table: Sequence[StateTensor], entries: Sequence, data: bytes, what: str
                   ) -> dict[str, np.ndarray]:
    """The tensors of ``entries`` (a header's table, or the package's own) in ``data``, checked against the
    package's ``table``: the same names and shapes, each inside the data, none overlapping another, finite values;
    in the package's order."""
    expected = {t.name: tuple(t.shape) for t in table}
    given = {e.name: tuple(e.shape) for e in entries}
    if given != expected or len(entries) != len(table):
        missing = sorted(set(expected) - set(given))
        extra = sorted(set(given) - set(expected))
        shapes = sorted(f"{n}: {given[n]} instead of {expected[n]}" for n in set(given) & set(expected)
                        if given[n] != expected[n])
        raise TrainingPackageError(f"{what} does not hold the package's state: missing {missing}, unknown {extra}, "
                                   f"other shapes {shapes}")
    out, end = {}, 0
    for e in sorted(entries, key=lambda e: e.offset):
        start, count = e.offset, e.length
        if start % 4 or start < end or start + 4 * count > len(data):
            raise TrainingPackageError(f"{what}: tensor {e.name!r} lies outside the data or over another tensor "
                                       f"(bytes {start} to {start + 4 * count} of {len(data)})")
        end = start + 4 * count
        array = np.frombuffer(data, dtype="<f4", count=count, offset=start).astype(np.float32).reshape(e.shape)
        if not np.isfinite(array).all():
            bad = int(np.size(array) - np.isfinite(array).sum())
            raise TrainingPackageError(f"{what}: tensor {e.name!r} holds {bad} non-finite value(s)")
        out[e.name] = array
    return {t.name: out[t.name] for t in table}

