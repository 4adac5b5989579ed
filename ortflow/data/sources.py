"""Data sources: tables read in chunks while training, so a table larger than memory trains with bounded memory.

``fit(source)`` takes, besides arrays and frames, any object with the small interface of :class:`BatchSource`:

- ``chunks(rng)`` yields one epoch of rows as ``(X, y, sample_weight or None)`` triples, ``X`` being anything the
  trainers take (an array, a DataFrame, a dict of columns); ``rng`` (a ``numpy.random.RandomState``, None for no
  shuffle) orders the epoch. A chunk may be a 4-tuple ``(X, y, sample_weight, order)``: ``order`` (indices into
  the chunk's rows) says which rows to train in which order, so a shuffling source leaves its rows where they are
  and the trainer gathers each batch, as it does in memory (one copy of every row, not two); the sources here
  yield it when they shuffle (``rng`` not None), so ``X[order]`` is the chunk as trained;
- ``n_rows``: the rows of an epoch when known without reading them (None otherwise);
- optionally ``head(rows)``: the first rows as one ``(X, y, sample_weight)`` triple, read cheaply (the trainer is
  set up from them; without it, from the first chunk);
- optionally ``identity()``: a small JSON-able dict telling this source from another one of its class (files, block
  size...), recorded by a checkpoint written inside an epoch and compared when it is resumed
  (:func:`source_identity`);
- optionally ``skips_rows = True`` and ``chunks(rng, skip_rows)``: the epoch without its first ``skip_rows`` rows,
  ``rng`` left as after the whole epoch, cheaper than reading them (a resume inside an epoch); without it, the
  trainer reads those rows and drops them.

The sources here:

- :class:`ParquetSource`: a Parquet file or folder (or the files of it given), read row group by row group, a row
  group larger than ``buffer_rows`` in slices of ``buffer_rows`` rows, page checksums verified where the files have
  them; each file's column types are checked against the first file's when it opens (integers and floats mixed
  read as floats, another difference refused naming the file and the column);
- :class:`ArrowSource`: an Arrow table or ``RecordBatchReader`` factory;
- :class:`NumpySource`: ``.npy`` files memory-mapped (``np.load(mmap_mode='r')``);
- :class:`IterableSource`: anything iterable again each epoch over ``(X, y)`` batches, a torch ``DataLoader`` too.

**Shuffling is not a full permutation.** A shuffled epoch visits the row groups (blocks) in a random order and
permutes the rows within a buffer of ``buffer_rows`` rows gathered from consecutive groups: a row moves within its
buffer only. It is reproducible: the same ``random_state`` gives the same epochs. A streamed epoch therefore differs
from an in-memory one of the same rows; make ``buffer_rows`` large against the row group size for a better mix.

**A checkpoint inside an epoch.** ``Checkpoint(folder, every_rows=N)`` writes one at the first chunk boundary after
every ``N`` rows of a streamed epoch: the weights and optimizer state, the position (rows trained), the random
state at the epoch's start and the epoch's batch losses so far. ``fit(source, resume_from=folder)`` restores that
random state, so the source yields the same order again, skips the rows already trained (a ``ParquetSource``
without reading the buffers before them, see ``skips_rows``) and ends with the weights of a run never interrupted.
The checkpoint records the source's identity (:func:`source_identity`): a resume on another one is refused. An
:class:`IterableSource` orders its epochs itself: it resumes right only when it yields the same batches again. A
``DataLoader`` with ``shuffle=True`` does not (its order comes from torch's random state, which no checkpoint
holds): ``Checkpoint(every_rows=...)`` and a resume inside an epoch are refused on it (:func:`replays_order`).

**Validation** is a second source (``fit(source, validation_data=other)``) or a held-out part of the same source,
``source.split(fraction, key=column)``: a row belongs to the validation part when a stable hash of its ``key`` value
falls under ``fraction`` (the same rows on every run and machine); without a key, the hash is of the row's
position (its file's name and its row in that file: one file splits as the fraction says, and the rows of each part
are known from the files' metadata). ``source.split([test, validation], key=column)`` cuts three parts from the
same hash (the bands ``[0, test)``, ``[test, test + validation)`` and the rest). The hash is of the key's value, whatever its type (a
whole float as its integer); a null key is refused naming the file and the row group.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .prefetch import Prefetcher

_log = logging.getLogger(__name__)


@runtime_checkable
class BatchSource(Protocol):
    """What ``fit`` streams from: ``chunks(rng)`` yields one epoch as ``(X, y, sample_weight)`` triples."""

    n_rows: int | None

    def chunks(self, rng: np.random.RandomState | None) -> Iterator[tuple[Any, Any, Any]]: ...


def _stable_fraction(values: np.ndarray) -> np.ndarray:
    """A number in [0, 1) per value, the same on every run and machine (pandas' SipHash with its fixed key), and the
    same for a value however it was read: a whole float hashes as its integer (a key column with a null is read as
    floats, and 5.0 must fall where 5 does); integers of any width hash alike."""
    import pandas as pd

    values = np.asarray(values)
    if values.dtype.kind == "f":
        whole = np.isfinite(values) & (np.round(values) == values) & (np.abs(values) < 2.0 ** 62)
        if whole.any():
            fractions = np.empty(len(values))
            fractions[whole] = _stable_fraction(values[whole].astype(np.int64))
            fractions[~whole] = _stable_fraction(values[~whole])  # none whole: hashed as floats
            return fractions
    hashed = pd.util.hash_array(values, categorize=False)
    return (hashed >> np.uint64(11)).astype(np.float64) / float(1 << 53)


class _Held:
    """Which rows of a source an epoch keeps: all (no band), or those whose stable hash falls in the band
    ``[low, high)`` of [0, 1): of ``key``'s values, or without a key of the row's position (its file's name and its
    row in that file, :func:`_position_fractions`)."""

    def __init__(self, low: float | None = None, high: float | None = None, key: str | None = None):
        self.band = None if low is None else (float(low), float(high))
        self.key = key

    @property
    def by_position(self) -> bool:
        """Whether the rows kept follow from their positions alone (known from the files' metadata)."""
        return self.band is not None and self.key is None

    def rows(self, frame) -> np.ndarray | None:
        """The mask of kept rows (None: all of them)."""
        if self.band is None:
            return None
        if self.key is None:
            return self._inside(frame[_POSITION])
        if self.key not in frame:
            raise KeyError(f"split key {self.key!r} is not a column of the source (columns: {list(frame)})")
        return self._inside(_stable_fraction(np.asarray(frame[self.key])))

    def count(self, file: str, start: int, stop: int) -> int:
        """The rows ``[start, stop)`` of ``file`` kept, from their positions (a split by position only)."""
        return int(self._inside(_position_fractions(file, start, stop)).sum())

    def _inside(self, fractions: np.ndarray) -> np.ndarray:
        low, high = self.band
        return (fractions >= low) & (fractions < high)


def _position_fractions(file: str, start: int, stop: int) -> np.ndarray:
    """The stable fraction (:func:`_stable_fraction`) of the rows ``[start, stop)`` of ``file``: of the row's
    number in the file mixed with a digest of the file's name, so that one file splits as the fractions say, a file
    added to the folder moves no other row, and the same rows fall in a part on every run and machine."""
    seed = np.uint64(int.from_bytes(hashlib.sha256(os.path.basename(file).encode()).digest()[:8], "little"))
    return _stable_fraction(np.arange(start, stop, dtype=np.uint64) ^ seed)


def _family(arrow_type) -> str:
    """What a column holds, whatever its width or encoding: ``int``, ``float``, ``bool``, ``text``, ``date`` (or
    the type itself)."""
    import pyarrow.types as pt

    if pt.is_dictionary(arrow_type):
        return _family(arrow_type.value_type)
    for family, test in (("int", pt.is_integer), ("float", pt.is_floating), ("bool", pt.is_boolean),
                         ("text", lambda t: pt.is_string(t) or pt.is_large_string(t)),
                         ("date", lambda t: pt.is_date(t) or pt.is_timestamp(t))):
        if test(arrow_type):
            return family
    return str(arrow_type)


_SAID: set[tuple[str, str]] = set()  # the columns whose widening was said (once per folder and column)


def _widened(path: str, reference, metadata: dict, columns: list[str]) -> set[str]:
    """Each file's type of ``columns`` checked against ``reference`` (the first file's schema, which the sample is
    read with): the same family (:func:`_family`) reads as it is; integers in some files and floats in others are
    the columns returned, read as float64 in every file (a warning says so); any other difference is a TypeError
    naming the file and the column (a float column that is text in one file would be read as text)."""
    widened, first = set(), next(iter(metadata))
    for file, meta in metadata.items():
        schema = meta.schema.to_arrow_schema()
        for column in columns:
            expected, found = reference.field(column).type, schema.field(column).type
            pair = {_family(expected), _family(found)}
            if len(pair) == 1:
                continue
            if pair != {"int", "float"}:
                raise TypeError(f"{file}: column {column!r} is {found}, where {os.path.basename(first)} (the first "
                                f"file, which the sample is read from) has {expected}: every file of {path} must "
                                "give a column one kind of values; rewrite that file, or leave the column out")
            widened.add(column)
            if (path, column) not in _SAID:
                _SAID.add((path, column))
                _log.warning("%s: column %r is %s in %s and %s in %s: read as float64 in every file", path, column,
                             expected, os.path.basename(first), found, os.path.basename(file))
    return widened


def _bands(fraction) -> list[tuple[float, float]]:
    """``[rest, held 1, held 2, ...]``: the held-out bands one after another from 0, the rest above them."""
    fractions = [fraction] if np.isscalar(fraction) else list(fraction)
    if not fractions or any(not 0.0 < f < 1.0 for f in fractions) or not sum(fractions) < 1.0:
        raise ValueError(f"split fraction={fraction!r} must be in (0, 1) (several: each, and their sum below 1)")
    edges = np.cumsum([0.0, *fractions]).tolist()
    return [(edges[-1], 1.0), *zip(edges[:-1], edges[1:])]



_MATRIX = "\0features"  # the key of the feature matrix among a buffer's columns
_POSITION = "\0position"  # the key of the rows' position fractions among a row group's columns (split by position)
_BLOCK_ROWS = 4096  # the columns are written into the matrix this many rows at a time (2x faster than whole columns)


class ParquetSource:
    """A Parquet file or a folder of Parquet files, read one row group at a time.

    ``target`` names the label column, ``weight`` an optional sample-weight column, ``columns`` the features (default:
    every other column, the split key excluded). ``buffer_rows`` bounds the rows held at once (and the shuffle's reach).
    ``files``: the Parquet files of the folder to read (default: those it holds now), so that a run reads the files
    it recorded, not one added to the folder since.
    """

    def __init__(self, path: str | os.PathLike, target: str, columns: list[str] | None = None,
                 weight: str | None = None, buffer_rows: int = 65536, _held: _Held | None = None,
                 files: list[str] | None = None):
        import pyarrow.dataset as ds

        self.path, self.target, self.weight = str(path), target, weight
        self.buffer_rows = int(buffer_rows)
        if self.buffer_rows < 1:
            raise ValueError(f"buffer_rows={buffer_rows!r} must be a positive integer")
        self._held = _held or _Held()
        self._listed = None if files is None else [str(f) for f in files]
        self._dataset = ds.dataset(self._listed or self.path, format="parquet")
        names = self._dataset.schema.names
        for role, name in (("target", target), ("weight", weight)):
            if name is not None and name not in names:
                raise KeyError(f"{role} column {name!r} is not in {self.path} (columns: {names})")
        skip = {target, weight, self._held.key}
        self.columns = list(columns) if columns is not None else [n for n in names if n not in skip]
        unknown = [c for c in self.columns if c not in names]
        if unknown:
            raise KeyError(f"columns {unknown} are not in {self.path} (columns: {names})")
        self._files = [f.path for f in self._dataset.get_fragments()]
        if not self._files:
            raise EmptyPartError(f"{self.path} holds no Parquet file")
        self._readers: dict[int, Any] = {}  # a few open files (a folder of thousands is never opened at once)
        self._matrices = _Reused()
        self._groups = []
        wanted = self._wanted()
        metadata = {f.path: self._metadata(f.path) for f in self._dataset.get_fragments()}
        for file, meta in metadata.items():
            missing = [c for c in wanted if c not in meta.schema.names]
            if missing:
                raise ValueError(f"{file} has no column {missing} (its columns: {meta.schema.names}): every file of "
                                 f"{self.path} must hold the source's columns")
        #: the columns read as float64 in every file: integers in some files, floats in others
        self._widened = _widened(self.path, self._dataset.schema, metadata, wanted)
        self._starts = []  # the row of its file each row group starts at
        for fi, file in enumerate(self._files):
            meta = metadata[file]
            if self._held.key is not None:
                self._check_key(file, meta)
            start = 0
            for g in range(meta.num_row_groups):
                self._groups.append((fi, g, meta.row_group(g).num_rows))
                self._starts.append(start)
                start += meta.row_group(g).num_rows
        self._group_kept = {}  # the rows each row group keeps (a split by position), counted once
        self.n_rows = (None if self._held.key is not None
                       else sum(self._kept(i, 0, n) for i, (_, _, n) in enumerate(self._groups)))
        if self._held.band is not None and self.n_rows == 0:
            raise EmptyPartError(f"{self.path} holds no row for this part of the split (rows "
                                 f"{self._held.band[0]:g} to {self._held.band[1]:g} of the hash)")

    def _kept(self, index: int, start: int, stop: int) -> int | None:
        """The rows ``[start, stop)`` of row group ``index`` this part keeps, when known without reading them (no
        split, or a split by position); None for a split by key."""
        if self._held.band is None:
            return stop - start
        if self._held.key is not None:
            return None
        fi, _, rows = self._groups[index]
        whole = (start, stop) == (0, rows)
        if whole and index in self._group_kept:
            return self._group_kept[index]
        kept = self._held.count(self._files[fi], self._starts[index] + start, self._starts[index] + stop)
        if whole:
            self._group_kept[index] = kept
        return kept

    def split(self, fraction, key: str | None = None) -> tuple[ParquetSource, ...]:
        """``(training part, validation part)``, by a stable hash of ``key``'s values, or of file names.

        ``fraction`` may be a list ``[f1, f2, ...]``: then ``(rest, part 1, part 2, ...)``, part 1 holding the rows
        whose hash falls in ``[0, f1)``, part 2 those in ``[f1, f1 + f2)``... A test, a validation and a training
        part from one hash: part 1 keeps its rows whatever ``f2`` is."""
        columns = [c for c in self.columns if c != key]  # the key says where a row goes, it is no feature
        return tuple(ParquetSource(self.path, self.target, columns, self.weight, self.buffer_rows,
                                   _Held(low, high, key), self._listed) for low, high in _bands(fraction))

    @property
    def files(self) -> list[str]:
        return list(self._files)

    def identity(self) -> dict:
        """The source as a mid-epoch checkpoint records it (:func:`source_identity`): the files (by name) and the
        rows of each row group as a digest, the columns, the buffer and the split."""
        layout = [(os.path.basename(self._files[fi]), group, rows) for fi, group, rows in self._groups]
        digest = hashlib.sha256(json.dumps(layout).encode()).hexdigest()[:16]
        return {"files": len(self._files), "row_groups": f"{len(self._groups)} ({digest})",
                "columns": [*self.columns, self.target, self.weight], "buffer_rows": self.buffer_rows,
                "split": [None if self._held.band is None else list(self._held.band), self._held.key,
                          "by position" if self._held.by_position else "by key" if self._held.key else None]}

    @staticmethod
    def _metadata(file: str):
        import pyarrow.parquet as pq

        try:
            return pq.read_metadata(file)
        except OSError as exc:
            raise _unreadable(file, exc) from exc
        except Exception as exc:  # noqa: BLE001 - pyarrow's ArrowInvalid: not Parquet, or a truncated footer
            raise _unreadable(file, exc) from exc

    def _check_key(self, file: str, meta) -> None:
        """A split key with a null, as the file's statistics count them (where it has them; ``_read`` checks the
        rest): a row without a key belongs to no part, and the key read as floats would move the other rows."""
        index = meta.schema.names.index(self._held.key)
        for group in range(meta.num_row_groups):
            statistics = meta.row_group(group).column(index).statistics
            if statistics is not None and statistics.has_null_count and statistics.null_count:
                raise _null_key(file, group, self._held.key, statistics.null_count)

    def _wanted(self) -> list[str]:
        return list(dict.fromkeys([*self.columns, self.target, *([self.weight] if self.weight else []),
                                   *([self._held.key] if self._held.key else [])]))

    def _reader(self, index: int):
        import pyarrow.parquet as pq

        reader = self._readers.pop(index, None)
        if reader is None:
            if len(self._readers) >= 8:
                self._readers.pop(next(iter(self._readers))).close()
            # page checksums verified where the writer stored them (write_page_checksum=True): a flipped bit in a
            # data page is an error naming the file, not other numbers. Column chunks read through a 4 MiB buffer,
            # not pre-buffered whole: a slice of a large row group (_slices) holds its pages only (one 2M x 20
            # row group in slices of 1,000 rows: 300 MB peak RSS, 540 MB pre-buffered, 1,150 MB read whole)
            reader = pq.ParquetFile(self._files[index], page_checksum_verification=True, pre_buffer=False,
                                    buffer_size=1 << 22)
        self._readers[index] = reader  # the most recent last
        return reader

    def _read(self, index: int) -> dict[str, np.ndarray]:
        """One row group as numpy columns (features, target, weight, split key)."""
        fi, group, rows = self._groups[index]
        wanted = self._wanted()
        try:
            table = self._reader(fi).read_row_group(group, columns=wanted)
        except Exception as exc:  # noqa: BLE001 - a file removed, truncated or rewritten since the source opened
            self._readers.pop(fi, None)
            raise _unreadable(self._files[fi], exc, f"row group {group}") from exc
        if table.num_rows != rows:
            raise ValueError(f"{self._files[fi]} changed while training: row group {group} has {table.num_rows} rows, "
                             f"{rows} when the source was opened")
        return self._numpy(table, index)

    def _numpy(self, table, index: int, start: int = 0) -> dict[str, np.ndarray]:
        """The columns of row group ``index`` (or of its slice from row ``start``) read, as numpy arrays: a null
        split key refused, the widened columns as float64; for a split by position, the rows' fractions."""
        fi, group, _ = self._groups[index]
        if self._held.key is not None and table.column(self._held.key).null_count:
            raise _null_key(self._files[fi], group, self._held.key, table.column(self._held.key).null_count)
        columns = {name: (table.column(name).to_numpy(zero_copy_only=False) if name not in self._widened
                          else table.column(name).to_numpy(zero_copy_only=False).astype(np.float64))
                   for name in self._wanted()}
        if self._held.by_position:
            first = self._starts[index] + start
            columns[_POSITION] = _position_fractions(self._files[fi], first, first + table.num_rows)
        return columns

    def _slices(self, index: int) -> Iterator[dict[str, np.ndarray]]:
        """A row group larger than the buffer, read in slices of ``buffer_rows`` rows (``iter_batches``): only a
        slice is decoded at a time, so ``buffer_rows`` bounds the memory whatever the files' row groups."""
        fi, group, rows = self._groups[index]
        try:
            batches = self._reader(fi).iter_batches(batch_size=self.buffer_rows, row_groups=[group],
                                                    columns=self._wanted())
            for start in range(0, rows, self.buffer_rows):
                batch = next(batches)
                if batch.num_rows != min(self.buffer_rows, rows - start):
                    raise ValueError(f"row group {group} read {batch.num_rows} rows at row {start}, of {rows}")
                yield self._numpy(batch, index, start)
        except Exception as exc:  # noqa: BLE001 - a file removed, truncated or rewritten since the source opened
            self._readers.pop(fi, None)
            raise _unreadable(self._files[fi], exc, f"row group {group}") from exc

    def _pieces(self, pieces: list[tuple[int, int, int]]) -> Iterator[dict[str, np.ndarray]]:
        """The columns of each piece ``(row group, start, stop)``: a whole row group read at once, the slices of a
        larger one (:meth:`_slices`) from one pass over it (consecutive pieces of the group; a first piece past its
        start, after a skip, has the slices before it decoded and dropped)."""
        slices, position = None, None
        for index, start, stop in pieces:
            if start == 0 and stop == self._groups[index][2]:
                yield self._read(index)
                continue
            if position != (index, start):
                slices = self._slices(index)
                for _ in range(start // self.buffer_rows):
                    next(slices)
            position = (index, stop)
            yield next(slices)

    def _layout(self, order) -> list[list[tuple[int, int, int]]]:
        """The buffers of an epoch visiting the row groups in ``order``: each a list of pieces ``(row group,
        start, stop)``, whole row groups gathered until ``buffer_rows`` rows, a larger row group cut into slices
        of ``buffer_rows`` rows that are buffers of their own."""
        buffers, current, held = [], [], 0
        for index in order:
            rows = self._groups[index][2]
            if rows > self.buffer_rows:
                if current:
                    buffers.append(current)
                    current, held = [], 0
                buffers.extend([(int(index), s, min(s + self.buffer_rows, rows))]
                               for s in range(0, rows, self.buffer_rows))
                continue
            current.append((int(index), 0, rows))
            held += rows
            if held >= self.buffer_rows:
                buffers.append(current)
                current, held = [], 0
        if current:
            buffers.append(current)
        return buffers

    @property
    def types(self) -> dict[str, str]:
        """The Arrow type of each column read (features, target, weight, split key): the first file's, ``double``
        for a column widened (integers in some files, floats in others)."""
        schema = self._dataset.schema
        return {name: "double" if name in self._widened else str(schema.field(name).type) for name in self._wanted()}

    def _features(self, columns: dict[str, np.ndarray]):
        """The features as a DataFrame: one float block when every feature is a number of one dtype (what a
        float-matrix graph takes without another copy), one column per feature otherwise."""
        import pandas as pd

        arrays = [columns[c] for c in self.columns]
        dtypes = {a.dtype for a in arrays}
        if len(dtypes) == 1 and next(iter(dtypes)).kind in "fiu":
            matrix = np.empty((len(arrays[0]), len(arrays)), dtype=next(iter(dtypes)))
            for i, array in enumerate(arrays):
                matrix[:, i] = array
            return self._frame(matrix)
        return pd.DataFrame(dict(zip(self.columns, arrays)), copy=False)

    def head(self, rows: int):
        """``(X, y, sample_weight)`` of the first rows of this part, for setting a trainer up: row groups (or the
        slices of one larger than the buffer) read in order until ``rows`` rows are gathered."""
        parts, count = [], 0
        for columns in self._pieces([p for buffer in self._layout(range(len(self._groups))) for p in buffer]):
            mask = self._held.rows(columns)
            parts.append({k: (v if mask is None else v[mask])[:rows - count] for k, v in columns.items()})
            count += len(parts[-1][self.target])
            if count >= rows:
                break
        columns = {k: np.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k] for k in parts[0]}
        return self._features(columns), columns[self.target], columns.get(self.weight) if self.weight else None

    #: ``chunks`` takes ``skip_rows`` (see :class:`BatchSource`)
    skips_rows = True

    def chunks(self, rng: np.random.RandomState | None, skip_rows: int = 0) -> Iterator[tuple[Any, Any, Any]]:
        """One epoch, from its row ``skip_rows`` on (a resume inside the epoch): a buffer wholly before it is not
        read when its rows are known from the files' metadata (no split by key), its shuffle drawn all the same
        so that ``rng`` ends as after the whole epoch."""
        order = np.arange(len(self._groups)) if rng is None else rng.permutation(len(self._groups))
        buffers = self._layout(order)  # the pieces of row groups of each buffer, from the files' metadata
        known = [None if self._held.key is not None else sum(self._kept(*piece) for piece in pieces)
                 for pieces in buffers]  # each buffer's rows, when the files' metadata tells them
        before = np.cumsum([0, *(k or 0 for k in known)])[:-1]  # the rows before each buffer (when known)
        skipped = [k is not None and b + k <= skip_rows for k, b in zip(known, before)]
        # the row groups read and decoded on a thread of their own, up to a buffer ahead of the one gathered here
        wanted = [piece for pieces, skip in zip(buffers, skipped) if not skip for piece in pieces]
        try:
            with Prefetcher(self._pieces(wanted), max(map(len, buffers), default=1)) as read:
                yield from self._buffers(buffers, known, skipped, read, rng, skip_rows)
        finally:
            self._matrices.arrays.clear()  # a source kept after its epochs holds no buffer

    def _buffers(self, buffers, known, skipped, read, rng, skip_rows: int) -> Iterator[tuple]:
        """The chunks of ``chunks``: each buffer gathered from its row groups as ``read`` yields them, its order
        drawn (skipped buffers draw theirs too, so that ``rng`` ends as after the whole epoch)."""
        done = 0  # the rows of the epoch before this buffer
        for groups, rows, skip in zip(buffers, known, skipped):
            if skip:
                if rows and rng is not None:
                    rng.permutation(rows)
                done += rows
                continue
            columns = self._gather([next(read) for _ in groups])
            n = len(columns[self.target])
            if n == 0:
                continue
            order = None if rng is None else rng.permutation(n)  # the rows stay where they are: the trainer gathers
            if done < skip_rows:
                if order is None:
                    columns = {k: v[skip_rows - done:] for k, v in columns.items()}
                else:
                    order = order[skip_rows - done:]
            done += n
            if done <= skip_rows:
                continue
            weight = columns[self.weight] if self.weight else None
            features = columns.pop(_MATRIX, None)
            yield _chunk(self._features(columns) if features is None else self._frame(features), columns[self.target],
                         weight, order)

    def _gather(self, groups: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The rows of the row groups read (``_read``), split rows dropped, the features as one matrix under
        ``_MATRIX`` when they are all numbers of one dtype (each row group written straight into it: one copy),
        else one array per column."""
        parts = []
        for columns in groups:
            mask = self._held.rows(columns)
            parts.append(columns if mask is None else {k: v[mask] for k, v in columns.items()})
        # every row group's dtypes: an integer column with a null in one row group is read as floats (NaN) there,
        # and cast into the integers of another it would become -9223372036854775808, no longer a gap
        dtypes = {p[c].dtype for p in parts for c in self.columns}
        if len(dtypes) != 1 or next(iter(dtypes)).kind not in "fiu":  # concatenated: NaN stays NaN
            return {k: np.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k] for k in parts[0]}
        total = sum(len(p[self.target]) for p in parts)
        matrix = self._matrices.take((total, len(self.columns)), next(iter(dtypes)))
        offset = 0
        for part in parts:
            rows = len(part[self.target])
            for begin in range(0, rows, _BLOCK_ROWS):  # by blocks of rows, whose part of the matrix stays in cache
                end = min(rows, begin + _BLOCK_ROWS)
                block = matrix[offset + begin:offset + end]
                for i, column in enumerate(self.columns):
                    block[:, i] = part[column][begin:end]
            offset += rows
        others = [k for k in parts[0] if k not in self.columns or k in (self.target, self.weight)]
        gathered = {k: np.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k] for k in others}
        gathered[_MATRIX] = matrix
        return gathered

    def _frame(self, matrix: np.ndarray):
        import pandas as pd

        return pd.DataFrame(matrix, columns=self.columns, copy=False)


class _Reused:
    """Arrays handed out again once nobody holds them: a buffer's feature matrix is written into the matrix of an
    earlier buffer that every chunk, frame and batch made from it has let go of, rather than into a new allocation,
    whose pages the kernel faults in and zeroes again (and may compact memory for, to back them with huge pages):
    0.07-0.4 µs of system time a row of 50 floats on a 2-vCPU VM, as much as the rest of reading the row."""

    def __init__(self, keep: int = 6):
        self.keep, self.arrays = keep, []

    def take(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        # the reference counts of the arrays kept here and of a new array nothing else refers to, taken the same
        # way (whatever references the interpreter holds or borrows while counting): a kept array counted once more
        # than the new one (this list's reference) is referred to by no view, frame or chunk
        counts = [sys.getrefcount(array) for array in [np.empty(0), *self.arrays]]
        for array, count in zip(self.arrays, counts[1:]):
            if array.shape == shape and array.dtype == dtype and count == counts[0] + 1:
                return array
        array = np.empty(shape, dtype=dtype)
        self.arrays = [*self.arrays[-(self.keep - 1):], array]
        return array


class ArrowSource:
    """Arrow data: a ``pyarrow.Table`` (re-read each epoch, blocks shuffled) or a callable returning a new
    ``RecordBatchReader`` per epoch (a one-shot stream keeps its order: it is never shuffled)."""

    def __init__(self, data, target: str, columns: list[str] | None = None, weight: str | None = None,
                 block_rows: int = 65536):
        self.data, self.target, self.weight, self.block_rows = data, target, weight, int(block_rows)
        self.columns = columns
        self.n_rows = data.num_rows if hasattr(data, "num_rows") else None

    def identity(self) -> dict:
        return {"block_rows": self.block_rows}

    def chunks(self, rng: np.random.RandomState | None) -> Iterator[tuple[Any, Any, Any]]:
        if callable(self.data):
            batches, rng = iter(self.data()), None
        else:
            starts = list(range(0, self.data.num_rows, self.block_rows))
            order = starts if rng is None else [starts[i] for i in rng.permutation(len(starts))]
            batches = (self.data.slice(s, self.block_rows) for s in order)
        for batch in batches:
            frame = batch.to_pandas()
            order = None if rng is None else rng.permutation(len(frame))
            columns = self.columns or [c for c in frame.columns if c not in (self.target, self.weight)]
            weight = None if self.weight is None else frame[self.weight].to_numpy()
            yield _chunk(frame[columns], frame[self.target].to_numpy(), weight, order)


class NumpySource:
    """``X`` and ``y`` in ``.npy`` files (or arrays), memory-mapped and read in blocks of ``block_rows`` rows."""

    def __init__(self, X, y, sample_weight=None, block_rows: int = 65536):
        def load(value):
            return np.load(value, mmap_mode="r") if isinstance(value, (str, os.PathLike)) else value

        self.X, self.y = load(X), load(y)
        self.sample_weight = None if sample_weight is None else load(sample_weight)
        if len(self.X) != len(self.y):
            raise ValueError(f"X has {len(self.X)} rows but y has {len(self.y)}")
        self.block_rows = int(block_rows)
        self.n_rows = len(self.X)

    def identity(self) -> dict:
        return {"block_rows": self.block_rows, "shape": list(self.X.shape)}

    def chunks(self, rng: np.random.RandomState | None) -> Iterator[tuple[Any, Any, Any]]:
        starts = np.arange(0, self.n_rows, self.block_rows)
        if rng is not None:
            starts = starts[rng.permutation(len(starts))]
        for start in starts:
            rows = slice(int(start), int(start) + self.block_rows)
            order = None if rng is None else rng.permutation(min(self.block_rows, self.n_rows - int(start)))
            X, y = np.asarray(self.X[rows]), np.asarray(self.y[rows])
            w = None if self.sample_weight is None else np.asarray(self.sample_weight[rows])
            yield _chunk(X, y, w, order)


class IterableSource:
    """Batches from anything iterable again each epoch (a torch ``DataLoader``, a generator function): each item is
    ``(X, y)`` or ``(X, y, sample_weight)``; tensors become numpy arrays. The iterable orders the epoch itself."""

    def __init__(self, iterable: Iterable | Callable[[], Iterable], n_rows: int | None = None):
        self.iterable, self.n_rows = iterable, n_rows

    @property
    def replays_order(self) -> bool:
        """False for a torch ``DataLoader`` whose sampler draws a random order (``shuffle=True``: torch's random
        state, which no checkpoint holds, orders its epochs); True otherwise, the iterable being trusted to yield
        the same batches again."""
        samplers = [getattr(self.iterable, "sampler", None),
                    getattr(getattr(self.iterable, "batch_sampler", None), "sampler", None)]
        return not any(cls.__name__ in _RANDOM_SAMPLERS for sampler in samplers if sampler is not None
                       for cls in type(sampler).__mro__)

    def chunks(self, rng: np.random.RandomState | None) -> Iterator[tuple[Any, Any, Any]]:
        items = self.iterable() if callable(self.iterable) else self.iterable
        for item in items:
            X, y, *rest = item
            yield _numpy(X), _numpy(y), _numpy(rest[0]) if rest else None


_RANDOM_SAMPLERS = {"RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler"}  # torch.utils.data's


def replays_order(source) -> bool:
    """Whether ``source`` yields the same epoch again from the same random state, which a resume inside an epoch
    needs (it replays the epoch and skips the rows trained): the sources here do; an :class:`IterableSource` over a
    shuffling ``DataLoader`` does not."""
    return bool(getattr(source, "replays_order", True))


def ordered(chunk) -> tuple[Any, Any, Any]:
    """``(X, y, sample_weight)`` of a chunk as it is trained: its rows taken in its ``order`` when it has one (a
    shuffled chunk of the sources here), for a loop of one's own over ``chunks``."""
    X, y, w, *order = chunk
    if not order or order[0] is None:
        return X, y, w
    index = np.asarray(order[0])

    def take(value):
        if value is None:
            return None
        if hasattr(value, "iloc"):
            return value.iloc[index].reset_index(drop=True)
        if isinstance(value, dict):
            return {k: np.asarray(v)[index] for k, v in value.items()}
        return np.asarray(value)[index]

    return take(X), take(y), take(w)


def _chunk(X, y, w, order):
    """A chunk as ``chunks`` yields it: ``(X, y, w)``, with its rows' ``order`` as a fourth item when shuffled."""
    return (X, y, w) if order is None else (X, y, w, order)


class EmptyPartError(ValueError):
    """A source without a file, or a part of a split that holds no row."""


def _null_key(file: str, group: int, key: str, count: int) -> ValueError:
    """The error of a split key with nulls: such rows would belong to no part (and make the key floats)."""
    return ValueError(f"{file} (row group {group}): the split key {key!r} is missing in {count} row(s): a row "
                      "without a key belongs to no part of the split; fill the key or drop those rows")


def _unreadable(file: str, exc: Exception, where: str = "") -> OSError:
    """The error of a Parquet file that cannot be read, naming it (and the row group)."""
    what = f" ({where})" if where else ""
    return OSError(f"{file}{what} cannot be read as Parquet: {type(exc).__name__}: {exc} (removed, truncated, "
                   "corrupted or not a Parquet file?)")


def _numpy(value):
    if hasattr(value, "detach"):  # a torch tensor
        return value.detach().cpu().numpy()
    return value


def source_identity(source) -> dict:
    """What a mid-epoch checkpoint records of the source a fit streams, and a resume compares: its class, its rows
    (None when unknown) and what its optional ``identity()`` adds (a Parquet source: its files' names and row
    groups, columns and buffer). Cheap: no row is read. Another source would give the epoch another order."""
    own = source.identity() if hasattr(source, "identity") else {}
    return {"type": type(source).__name__, "n_rows": source.n_rows, **own}


def is_source(X) -> bool:
    """Whether ``fit`` streams ``X`` (it has ``chunks``) rather than holding it in memory."""
    return isinstance(X, BatchSource)
