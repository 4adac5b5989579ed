"""``data=parquet``: a Parquet file or folder streamed through the stages, never held in memory.

The table is split by one stable hash (:meth:`ortflow.data.sources.ParquetSource.split`): the rows whose ``data.key``
hashes in ``[0, test_size)`` are the test part, a ``validation_fraction`` share of the other rows (the band
``[test_size, test_size + validation_fraction * (1 - test_size))``, as a table read whole splits) the validation
part, the rest the training part; without ``data.key`` the hash is of the row's position (its file's name and its
row in the file), so one file or a few split as the fractions say. The same rows on every run and machine,
whatever else changes. :func:`split_line` says how many rows each part holds (printed before the chain runs).

The columns follow ``preprocess`` as a table read whole (``data=file``) does. With ``preprocess=auto`` (the
default) they stay raw: numbers, booleans, text, categories and dates, each chunk's columns put in the form of
their kind (:func:`pipelines.data.tables.table_frame`, the kinds of the training part's first rows); ``convert``
fits the preprocessing on the training sample and it becomes the front of the graph, so gaps are imputed there. With
``preprocess=none`` the features must be numbers without gaps, standardized with the training sample's statistics.

What is read whole: nothing. What is sampled: the first ``data.sample_rows`` rows of each part (``convert`` fits the
scikit-learn start and reference and the preprocessing or standardization on the training sample; ``export`` takes
its input example and checks the registered graph on the test sample). What streams: training epochs and validation
(:class:`Prepared` over the parts), the test metrics (``evaluate``) and the scikit-learn baselines' test metrics
(``convert``), chunk by chunk.

The split's description (:class:`Stream`, JSON in ``split.npz``) is what later stages open the parts from, so a
stage run alone reads the same rows as the chain did.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from omegaconf import DictConfig

from ..base.errors import DataError, stream_hint

_log = logging.getLogger("pipelines.data.streams")
#: the parts of a split, in the order of :meth:`Stream.parts`
PARTS = ("train", "validation", "test")


@dataclass(frozen=True)
class Stream:
    """Where the rows of each part come from: a Parquet file or folder, its columns and the hash split."""

    path: str
    target: str
    columns: tuple[str, ...]
    key: str | None
    test_size: float
    validation_fraction: float
    buffer_rows: int
    junk_cells: str = "refuse"  # data.junk_cells: the cells of a number column that are not numbers
    files: tuple[str, ...] = ()  # the Parquet files the split was made of (empty: those the path holds now)
    # each file's signature when the split was made (file_signature), in the order of files: a later stage refuses
    # a file rewritten since
    signatures: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "columns": list(self.columns), "files": list(self.files),
                           "signatures": list(self.signatures)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Stream:
        values = json.loads(text)
        return cls(**{**values, "columns": tuple(values["columns"]), "files": tuple(values.get("files", ())),
                      "signatures": tuple(values.get("signatures", ()))})

    def rows_json(self) -> str:
        """:meth:`to_json` without what does not change the rows of the parts (``buffer_rows``, how many are read
        at once): what the split's fingerprint hashes."""
        values = json.loads(self.to_json())
        values.pop("buffer_rows")
        return json.dumps(values, sort_keys=True)

    def check_files(self) -> None:
        """A DataError naming each recorded file rewritten since the split was made (its size or its Parquet
        footer, which holds the row groups' statistics, differs) or gone: the parts would hold other rows than
        the ones the earlier stages trained and scored on."""
        changed = [file for file, signature in zip(self.files, self.signatures)
                   if not os.path.isfile(file) or file_signature(file) != signature]
        if changed:
            raise stream_error(f"{len(changed)} Parquet file(s) of {self.path} changed or went away since the split "
                               f"was made: {changed[:10]}; the stages after it would read other rows than those the "
                               "split holds. Run the chain again from the split (all its stages), or put the files "
                               "back as they were")

    def source(self):
        """The whole table as a ParquetSource over the files the split recorded (:meth:`check_files`: none
        rewritten since); a warning names the files the folder holds now beyond them (added since: not read, so
        that every stage reads the rows the split had)."""
        from ortflow.data.sources import ParquetSource

        self.check_files()
        source = ParquetSource(self.path, self.target, list(self.columns) or None, buffer_rows=self.buffer_rows,
                               files=list(self.files) or None)
        if self.files and os.path.isdir(self.path):
            import pyarrow.dataset as ds

            added = sorted(set(ds.dataset(self.path, format="parquet").files) - set(self.files))
            if added:
                _log.warning("%s holds %d Parquet file(s) added since the split was made, not read: %s", self.path,
                             len(added), [os.path.basename(f) for f in added[:10]])
        return source

    def parts(self) -> dict[str, Any]:
        """``{part: ParquetSource}`` (no ``validation`` when ``validation_fraction`` is 0), over the recorded files
        (:meth:`source`). ``validation_fraction`` is a share of the rows outside the test part, as for a table read
        whole (:func:`pipelines.data.datasets.make_split`): the validation band of the hash is
        ``validation_fraction * (1 - test_size)`` wide."""
        source = self.source()
        validation = self.validation_fraction * (1.0 - self.test_size)
        fractions = [self.test_size] + ([validation] if self.validation_fraction > 0 else [])
        parts = source.split(fractions, key=self.key)
        return dict(zip(("train", "test", "validation"), parts))


def open_stream(data: DictConfig, preprocess: DictConfig | None = None) -> tuple[Stream, dict[str, Any]]:
    """The configured table checked and split: ``(Stream, {part: ParquetSource})``. A :class:`DataError` names a
    missing path, a folder without Parquet files, a missing target, key or feature column, a column ``preprocess``
    cannot take (without preprocessing, a non-numeric one) and an empty part; its hint suggests ``data.key`` only
    where none is set. ``+preprocess.columns.<column>=drop`` leaves a column out."""
    try:
        return _open_stream(data, preprocess)
    except DataError as exc:
        exc.hint = stream_hint(key_set=bool(data.get("key")))
        raise


def _open_stream(data: DictConfig, preprocess: DictConfig | None) -> tuple[Stream, dict[str, Any]]:
    from ortflow.data.sources import EmptyPartError

    from ..base.paths import user_path
    from .tables import column_treatments

    path = user_path(str(data.path)).resolve()
    if not path.exists():
        raise stream_error(f"data.path={data.path!r}: {path} does not exist (a Parquet file or a folder of them)")
    if path.is_dir() and not any(p.is_file() and not p.name.startswith(("_", ".")) for p in path.rglob("*")):
        raise stream_error(f"data.path={data.path!r}: the folder {path} holds no Parquet file: write the table's "
                           "files into it, or point data.path to a Parquet file or a folder of them")
    schema = _schema(path, data)
    repeated = sorted({n for n in schema.names if schema.names.count(n) > 1})
    if repeated:
        raise stream_error(f"data.path={data.path!r}: {path} has several columns named {repeated}: rename them so "
                           "that each name is one column's")
    target, key = str(data.target), (str(data.key) if data.get("key") else None)
    for role, name in (("data.target", target), ("data.key", key)):
        if name is not None and name not in schema.names:
            raise stream_error(f"{role}={name!r} is not a column of {path}; its columns: {schema.names}")
    treatments = column_treatments(preprocess)
    unknown = sorted(set(treatments or ()) - set(schema.names))
    if unknown:
        raise stream_error(f"preprocess.columns names columns {unknown} missing from {path}; its columns: "
                           f"{schema.names}")
    if data.features:
        columns = [str(c) for c in data.features]
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise stream_error(f"data.features names columns {missing} missing from {path}; its columns: "
                               f"{schema.names}")
        included = [f"the target {target!r}"] * (target in columns) + [f"the split key {key!r}"] * (key in columns)
        if included:
            raise stream_error(f"data.features={columns} includes {' and '.join(included)}: list the feature columns "
                               "only")
    else:
        columns = [n for n in schema.names if n not in (target, key)]
    columns = [c for c in columns if (treatments or {}).get(c) != "drop"]
    if not columns:
        raise stream_error(f"{path} has no feature column besides the target {target!r}")
    if treatments is None:
        other = [c for c in columns if not _numeric(schema.field(c).type)]
        if other:
            raise stream_error(f"data=parquet with preprocess=none trains on numeric columns only, and {path} has the "
                               f"non-numeric columns {other}: preprocess=auto (the default) encodes text, categories, "
                            "dates and booleans inside the graph, or list the numeric ones in data.features=[...]")
    else:
        other = [f"{c} ({schema.field(c).type})" for c in columns if not _tabular(schema.field(c).type)]
        if other:
            raise stream_error(f"data=parquet takes columns of numbers, booleans, text, categories and dates, and "
                               f"{path} has the columns {other}: leave them out with data.features=[...] or "
                            "+preprocess.columns.<column>=drop")
    stream = Stream(str(path), target, tuple(columns), key, float(data.test_size),
                    float(data.validation_fraction), int(data.buffer_rows), str(data.get("junk_cells", "refuse")))
    try:
        files = tuple(stream.source().files)  # the files the run reads, whatever comes later, as they are now
        stream = replace(stream, files=files, signatures=tuple(file_signature(f) for f in files))
        parts = stream.parts()
        _log.info("%s", split_line(stream, parts))
        return stream, parts
    except EmptyPartError as exc:  # a part too small for any row to fall in it
        raise stream_error(f"data.path={data.path!r}: {exc}: raise data.test_size or data.validation_fraction, or "
                           "use a larger table") from None
    except (OSError, KeyError, TypeError, ValueError) as exc:  # unreadable, other columns or types, null keys
        raise stream_error(f"data.path={data.path!r}: {exc}") from None


def stream_error(message: str) -> DataError:
    """A DataError about the streamed table, with the hint of its own doc section (``data.drop_invalid`` does not
    apply to streams; :func:`open_stream` suggests ``data.key`` where none is set)."""
    return DataError(message, hint=stream_hint(key_set=True))


def split_line(stream: Stream, parts: dict[str, Any]) -> str:
    """The split in one line: the rows of each part (known from the files' metadata when no key splits them) and
    what the hash is of."""
    names = {"train": "training", "validation": "validation", "test": "test"}
    if stream.key is None:
        rows = ", ".join(f"{parts[p].n_rows} {names[p]}" for p in PARTS if p in parts)
        return (f"split of {stream.path}: {rows} rows (a stable hash of each row's position; data.key=<a column> "
                "hashes a column's values)")
    fractions = f"test {stream.test_size:g}, validation {stream.validation_fraction:g} of the other rows"
    return (f"split of {stream.path}: by a stable hash of data.key={stream.key!r} ({fractions}, training the rest; "
            "the rows of each part are counted as they are read)")


def _schema(path, data: DictConfig):
    import pyarrow.dataset as ds

    try:
        return ds.dataset(str(path), format="parquet").schema
    except Exception as exc:  # noqa: BLE001 - pyarrow's ArrowInvalid: not Parquet
        raise stream_error(f"data.path={data.path!r}: {path} cannot be read as Parquet: {type(exc).__name__}: "
                           f"{exc}") from None


def _numeric(arrow_type) -> bool:
    import pyarrow.types as pt

    return pt.is_integer(arrow_type) or pt.is_floating(arrow_type) or pt.is_boolean(arrow_type)


def _tabular(arrow_type) -> bool:
    """A column ``preprocess=auto`` takes: a number, a boolean, text, a category (dictionary of text) or a date."""
    import pyarrow.types as pt

    if pt.is_dictionary(arrow_type):
        return _tabular(arrow_type.value_type)
    return (_numeric(arrow_type) or pt.is_string(arrow_type) or pt.is_large_string(arrow_type)
            or pt.is_date(arrow_type) or pt.is_timestamp(arrow_type))


def sample(source, rows: int, kinds: dict[str, str] | None = None, junk_cells: str = "refuse"
           ) -> tuple[Any, np.ndarray]:
    """The first ``rows`` rows of ``source`` as ``(X, y)`` (:func:`raw_rows`)."""
    X, y, _ = source.head(rows)
    return raw_rows(source, X, y, "sample", kinds, junk_cells)


def raw_rows(source, X, y, where: str, kinds: dict[str, str] | None = None, junk_cells: str = "refuse"
             ) -> tuple[Any, np.ndarray]:
    """``(X, y)`` of a chunk of ``source`` before any scaling: without ``kinds`` (None or empty) a float64 matrix
    whose values are all finite (:func:`finite`); with ``kinds`` (``preprocess=auto``: each column's kind, from the
    training sample) the DataFrame of the columns in the form of their kind
    (:func:`pipelines.data.tables.table_frame`: a gap stays a gap, the preprocessing imputes it; a cell of a number
    column that is not a number is refused, or a gap with ``junk_cells="gap"``), the target checked."""
    if not kinds:
        return finite(source, np.asarray(X, dtype=np.float64), np.asarray(y), where)
    from .tables import table_frame

    y = np.asarray(y)
    check_target(source, y, where)
    return table_frame(X, file=f"{source.path} ({where} rows)", kinds=kinds, junk_cells=junk_cells), y


def check_target(source, y: np.ndarray, where: str) -> None:
    """A chunk's target: a gap or a number beyond float32 (which the model computes in) is a DataError naming the
    column, the part and the file."""
    if _target_gaps(y):
        raise stream_error(f"data.path={source.path!r}: the target {source.target!r} holds missing or non-finite "
                           f"values (in the {where} rows): fill or drop those rows in the table")
    _target_range(source, y, where)


def _target_range(source, y: np.ndarray, where: str) -> None:
    """A numeric target beyond float32's range named (:func:`pipelines.data.tables.check_float32`)."""
    from .tables import check_float32

    if y.dtype.kind in "fiu":
        check_float32(np.asarray(y, dtype=np.float64), f"the target {source.target!r}",
                      f"{source.path} ({where} rows)")


def _target_gaps(y: np.ndarray) -> bool:
    """Whether a chunk's target has a gap: a NaN or an infinity among numbers, a null among labels (read as None)."""
    if y.dtype.kind == "f":
        return not np.isfinite(y).all()
    if y.dtype != object:
        return False
    import pandas as pd

    return bool(pd.isna(y).any())


def finite(source, X: np.ndarray, y: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` of a chunk of ``source``, once every feature (and a numeric target) is a finite number: a gap
    (NaN, a null read as NaN) or an infinity would train to NaN weights and be reported as a divergence, or make
    the test metrics NaN. A :class:`DataError` names the columns, the part of the table and the way out."""
    bad = ~np.isfinite(X).all(axis=0)
    columns = [str(c) for c, b in zip(source.columns, bad) if b]
    if _target_gaps(y):
        columns.append(f"{source.target} (the target)")
    if columns:
        raise stream_error(f"data.path={source.path!r}: column(s) {columns} hold missing or non-finite values (in the "
                           f"{where} rows): data=parquet with preprocess=none feeds numeric columns as they are; "
                           "fill or drop the gaps in the table, or use preprocess=auto (the default), whose "
                           "preprocessing imputes them in the graph")
    _target_range(source, y, where)
    return X, y


def file_digest(files: list[str]) -> str:
    """A digest of the files' names, sizes and modification times: changes when a file is added, removed or
    rewritten, without reading any."""
    digest = hashlib.sha256()
    for file in sorted(files):
        stat = os.stat(file)
        digest.update(f"{os.path.basename(file)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def file_signature(file: str) -> str:
    """A Parquet file's size and the digest of its footer (the schema, the row groups and their statistics): a
    file rewritten with other rows has another, whatever its modification time says; read: the footer only."""
    size = os.path.getsize(file)
    with open(file, "rb") as handle:
        if size < 12:
            return f"{size}:short"
        handle.seek(size - 8)
        length = int.from_bytes(handle.read(4), "little")
        handle.seek(max(0, size - 8 - length))
        footer = handle.read(min(length, size - 8) + 8)
    return f"{size}:{hashlib.sha256(footer).hexdigest()[:16]}"


def constant_target(stream: Stream) -> float | None:
    """The one value of the target in every row of the stream's files, when their Parquet statistics say so (every
    row group's minimum and maximum that value, no null); None otherwise, or where a row group has no statistics.
    Read: the footers only."""
    import pyarrow.parquet as pq

    values = set()
    for file in stream.files:
        meta = pq.read_metadata(file)
        index = meta.schema.to_arrow_schema().get_field_index(stream.target)
        for group in range(meta.num_row_groups):
            statistics = meta.row_group(group).column(index).statistics
            if statistics is None or not statistics.has_min_max or statistics.null_count:
                return None
            values.update((statistics.min, statistics.max))
            if len(values) > 1:
                return None
    return next(iter(values)) if values else None


def labels_by_file(source) -> dict:
    """``{label: the first file holding it}`` of ``source``'s target (its part of the split), read one file and one
    row group at a time (the target column alone)."""
    from ortflow.data.sources import ParquetSource

    found: dict = {}
    for file in source.files:
        labels_only = ParquetSource(source.path, source.target, [], buffer_rows=source.buffer_rows,
                                    _held=source._held, files=[file])
        for _, y, _ in labels_only.chunks(None):
            for label in np.unique(np.asarray(y)).tolist():
                found.setdefault(label, file)
    return found


def description(stream: Stream) -> dict[str, Any]:
    """What lineage records of the table, from the files' metadata only: the files, their digest, the schema,
    the row count and the row groups."""
    import pyarrow.parquet as pq

    source = stream.source()
    files = source.files
    metadata = [pq.read_metadata(f) for f in files]
    schema = metadata[0].schema.to_arrow_schema()
    return {"path": stream.path, "files": files, "digest": file_digest(files),
            "n_rows": sum(m.num_rows for m in metadata), "n_row_groups": sum(m.num_row_groups for m in metadata),
            "schema": {**{name: str(schema.field(name).type) for name in schema.names}, **source.types}}


def labels_like(y, classes: np.ndarray) -> np.ndarray:
    """Labels read from a chunk in the dtype of the split's classes (int64 or text), as :func:`class_labels`
    gives them."""
    y = np.asarray(y)
    return y.astype(np.int64) if classes.dtype.kind in "iu" else y.astype(str)


class Prepared:
    """A :class:`ortflow.data.sources.BatchSource` over ``source`` whose chunks are what the split's training rows were:
    the features standardized ``(X - x_mean) / x_scale`` in float32, or with ``kinds`` (``preprocess=auto``) the raw
    columns in the form of their kind (the graph's preprocessing scales them); a regression target
    ``(y - y_mean) / y_scale``, a classifier's labels as the split's classes have them."""

    def __init__(self, source, x_mean: np.ndarray, x_scale: np.ndarray, y_mean: float, y_scale: float,
                 classes: np.ndarray, part: str = "training", kinds: dict[str, str] | None = None,
                 junk_cells: str = "refuse"):
        self.source, self.x_mean, self.x_scale = source, x_mean, x_scale
        self.y_mean, self.y_scale, self.classes = y_mean, y_scale, classes
        self.n_rows, self.part, self.kinds, self.junk_cells = source.n_rows, part, kinds, junk_cells
        self.skips_rows = getattr(source, "skips_rows", False)  # a resume inside an epoch skips without reading

    def identity(self) -> dict:
        """The wrapped source's (what a checkpoint inside an epoch records and a resume compares)."""
        from ortflow.data.sources import source_identity

        return source_identity(self.source)

    def _prepare(self, X, y, w) -> tuple[Any, np.ndarray, Any]:
        X, y = raw_rows(self.source, X, y, self.part, self.kinds, self.junk_cells)
        if not self.kinds:
            X = ((X - self.x_mean) / self.x_scale).astype(np.float32)
        if len(self.classes):
            return X, labels_like(y, self.classes), w
        return X, ((y.astype(np.float64) - self.y_mean) / self.y_scale).astype(np.float32), w

    def head(self, rows: int):
        return self._prepare(*self.source.head(rows))

    def chunks(self, rng: np.random.RandomState | None,
               skip_rows: int = 0) -> Iterator[tuple]:
        """The source's chunks prepared, each with the order of its rows when the source gives one."""
        for X, y, w, *order in (self.source.chunks(rng, skip_rows=skip_rows) if skip_rows
                                else self.source.chunks(rng)):
            yield (*self._prepare(X, y, w), *order)


def scan_labels(source) -> np.ndarray:
    """Every label of ``source``'s target, read one row group at a time (the target column alone)."""
    from ortflow.data.sources import ParquetSource

    labels_only = ParquetSource(source.path, source.target, [], buffer_rows=source.buffer_rows,
                                _held=source._held, files=source._listed)
    seen: set = set()
    for _, y, _ in labels_only.chunks(None):
        seen.update(np.unique(np.asarray(y)).tolist())
    return np.array(sorted(seen))
