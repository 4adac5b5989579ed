"""Data sets, the train/validation/test split and its standardization.

Synthetic sets come from ``make_regression``/``make_classification`` (seeded), ``diabetes``, ``breast_cancer``,
``iris`` and ``digits`` are bundled with scikit-learn (no download), ``file`` reads a CSV or Parquet table (checked
by :mod:`pipelines.data.tables`), ``parquet`` streams a Parquet file or folder (:mod:`pipelines.data.streams`: the
split holds samples of its parts and their description). ``digits_images`` ((n, 1, 8, 8) float32 images) and
``tokens`` ((n, T) int64 sequences, :func:`token_sequences`) are arrays for ``model=onnx`` graphs: split as they are,
never standardized. ``data.loader`` (or ``data.name``) picks the loader. The split is saved as one ``split.npz`` so a
stage run alone works on exactly the rows the earlier stages used.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from ..base.schema import data_loader
from .labels import class_labels, target_description


@dataclass
class Split:
    """Standardized arrays (float32) plus the statistics that undo the standardization."""

    task: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_valid: np.ndarray
    y_valid: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    x_mean: np.ndarray
    x_scale: np.ndarray
    y_mean: float
    y_scale: float
    feature_names: np.ndarray
    classes: np.ndarray  # the sorted class labels, as the data has them (classification); empty otherwise
    kinds: np.ndarray = field(default_factory=lambda: np.array([], dtype=str))  # a table's column kinds
    # data=parquet: the streamed table's description (pipelines.data.streams.Stream, JSON); X_*/y_* then hold the
    # first data.sample_rows rows of each part only
    stream: str = ""

    @property
    def streamed(self) -> bool:
        """The rows are streamed from Parquet (``data=parquet``): X_*/y_* are samples of the parts."""
        return bool(self.stream)

    def stream_parts(self) -> dict:
        """``{part: ParquetSource}`` of a streamed split (:meth:`pipelines.data.streams.Stream.parts`)."""
        from .streams import Stream

        return Stream.from_json(self.stream).parts()

    def prepared(self, source, part: str = "training"):
        """``source`` prepared as this split's training rows were (:class:`pipelines.data.streams.Prepared`):
        standardized, or a table's raw columns in the kinds of its training sample."""
        from .streams import Prepared

        return Prepared(source, self.x_mean.astype(np.float64), self.x_scale.astype(np.float64), self.y_mean,
                        self.y_scale, self.classes if self.task == "classification" else self.classes[:0], part,
                        self.column_kinds(), self.junk_cells)

    @property
    def junk_cells(self) -> str:
        """A streamed table's ``data.junk_cells`` (what its chunks' non-number cells of number columns become)."""
        from .streams import Stream

        return Stream.from_json(self.stream).junk_cells if self.stream else "refuse"

    @property
    def is_table(self) -> bool:
        """The features are raw columns (``preprocess=auto`` on a table): X_* are DataFrames, not standardized."""
        return not isinstance(self.X_train, np.ndarray)

    def column_kinds(self) -> dict[str, str]:
        """A table's columns and their kinds (:data:`pipelines.data.tables.KINDS`), in the order of the columns
        (empty for numeric arrays)."""
        return {str(c): str(k) for c, k in zip(self.feature_names, self.kinds)}

    @property
    def n_features(self) -> int:
        """The values of one row (an image's pixels, a sequence's tokens)."""
        return int(np.prod(self.X_train.shape[1:]))

    @property
    def has_validation(self) -> bool:
        return len(self.y_valid) > 0

    def raw_X(self, X: np.ndarray) -> np.ndarray:
        if not isinstance(X, np.ndarray):  # a table's raw columns
            return X
        if not len(self.x_mean):  # arrays never standardized (images, tokens): as they are
            return X
        return (X * self.x_scale + self.x_mean).astype(np.float32)

    def raw_rows(self, X: np.ndarray) -> np.ndarray:
        """:meth:`raw_X` with one row per sample (an image's pixels flattened): the columns of
        :attr:`feature_names`, what a DataFrame of the data (served model, dataset inputs) holds."""
        raw = self.raw_X(X)
        return raw.reshape(len(raw), -1) if isinstance(raw, np.ndarray) else raw

    def raw_y(self, y: np.ndarray) -> np.ndarray:
        return (np.asarray(y, dtype=np.float64) * self.y_scale + self.y_mean).astype(np.float32)

    def save(self, path: str | Path) -> Path:
        """One .npz of plain arrays (never pickles): a table's columns one array each, text as unicode."""
        path = Path(path)
        arrays = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray) or not hasattr(value, "columns"):
                arrays[f.name] = np.asarray(value)
                continue
            arrays[f.name] = np.array([str(c) for c in value.columns])  # the column names; the columns follow
            for i, column in enumerate(value.columns):
                values = value[column].to_numpy()
                arrays[f"{f.name}__{i}"] = values.astype(str) if values.dtype == object else values
        np.savez_compressed(path, **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Split:
        with np.load(path, allow_pickle=False) as data:
            values = {f.name: data[f.name] for f in fields(cls) if f.name in data.files}  # kinds: tables only
            if "X_train__0" in data.files:  # a table: the frames back, text as objects
                import pandas as pd

                for part in ("X_train", "X_valid", "X_test"):
                    names = [str(n) for n in values[part]]
                    columns = {n: data[f"{part}__{i}"] for i, n in enumerate(names)}
                    values[part] = pd.DataFrame({n: v.astype(object) if v.dtype.kind == "U" else v
                                                 for n, v in columns.items()}, columns=names)
        values["task"] = str(values["task"])
        values["stream"] = str(values.get("stream", ""))
        values["y_mean"] = float(values["y_mean"])
        values["y_scale"] = float(values["y_scale"])
        return cls(**values)

    def fingerprint(self) -> str:
        """A short hash of the test rows (standardized features and targets): equal splits, equal hashes."""
        import hashlib

        digest = hashlib.sha256()
        if self.streamed:  # the test part is the files' rows in the hash band: the description names them
            from .streams import Stream, description

            digest.update(Stream.from_json(self.stream).rows_json().encode())  # buffer_rows: the same rows
            digest.update(description(Stream.from_json(self.stream))["digest"].encode())
        X_test = self.X_test
        if self.is_table:
            import pandas as pd

            digest.update(",".join(str(c) for c in X_test.columns).encode())
            X_test = pd.util.hash_pandas_object(X_test, index=False).to_numpy()
        for array in (X_test, self.y_test, self.x_mean, self.x_scale):
            numeric = np.asarray(array).dtype.kind in "iufb"
            digest.update(np.ascontiguousarray(array, dtype=np.float32 if numeric else str).tobytes())
        digest.update(np.array([self.y_mean, self.y_scale], dtype=np.float64).tobytes())
        return digest.hexdigest()[:16]

    def summary(self) -> dict:
        if self.streamed:  # the rows of each part are known without reading unless a key splits them
            parts = self.stream_parts()
            rows = {f"n_{p}": parts[p].n_rows for p in parts}
            return {**{k: v for k, v in rows.items() if v is not None}, "n_sample_train": len(self.y_train),
                    "n_features": self.n_features}
        return {
            "n_train": len(self.y_train),
            "n_validation": len(self.y_valid),
            "n_test": len(self.y_test),
            "n_features": self.n_features,
        }


def load_dataset(data: DictConfig, notes: dict | None = None, preprocess: DictConfig | None = None
                 ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(X, y, feature names) of the configured data set; y holds the labels as they are for classification.
    ``notes`` receives what loading a table dropped (see :meth:`pipelines.data.tables.Table.report`); with
    ``preprocess.name=auto`` a table's X is the DataFrame of its raw columns."""
    from sklearn import datasets

    name = data_loader(data)
    seed = int(data.seed)
    if name == "regression":
        X, y = datasets.make_regression(
            n_samples=data.n_samples, n_features=data.n_features,
            n_informative=min(data.n_informative, data.n_features), noise=data.noise, random_state=seed,
        )
        names = [f"x{i}" for i in range(X.shape[1])]
    elif name == "classification":
        n_informative = min(data.n_informative, data.n_features)
        X, y = datasets.make_classification(
            n_samples=data.n_samples, n_features=data.n_features, n_informative=n_informative,
            n_redundant=min(2, data.n_features - n_informative), class_sep=data.class_sep, n_classes=2,
            random_state=seed,
        )
        names = [f"x{i}" for i in range(X.shape[1])]
    elif name == "diabetes":
        bunch = datasets.load_diabetes()
        X, y, names = bunch.data, bunch.target, list(bunch.feature_names)
    elif name in ("breast_cancer", "iris", "digits"):
        bunch = getattr(datasets, f"load_{name}")()
        X, y, names = bunch.data, bunch.target, [str(n) for n in bunch.feature_names]
    elif name == "digits_images":  # the graph's own input scale: pixels / 16 in [0, 1]
        bunch = datasets.load_digits()
        X = (bunch.images / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
        return X, np.asarray(bunch.target), [str(n) for n in bunch.feature_names]
    elif name == "tokens":
        X, y = token_sequences(int(data.n_samples), int(data.vocab_size), int(data.n_features), seed)
        return X, y, [f"token_{i}" for i in range(X.shape[1])]
    elif name == "file":
        from .tables import read_table

        table = read_table(data, preprocess)
        X, y, names = table.X, table.y, table.features
        if notes is not None:
            notes.update(table.report())
        if not isinstance(X, np.ndarray):
            if notes is not None:
                notes["kinds"] = [table.kinds[n] for n in names]
            return X, np.asarray(y), names
    else:  # pragma: no cover - data_loader rejects it first
        raise ValueError(f"data.loader={name!r} is unknown")
    return np.asarray(X, dtype=np.float64), np.asarray(y), names


def token_sequences(rows: int, vocab: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` int64 sequences of ``length`` tokens below ``vocab`` (seeded), labelled 1 where more than half the
    tokens are in the lower half of the vocabulary, else 0 (tests/reference_data.py's rule for the transformer)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=(rows, length)).astype(np.int64)
    return tokens, ((tokens < vocab // 2).sum(axis=1) > length // 2).astype(np.int64)


def make_split(data: DictConfig, notes: dict | None = None, preprocess: DictConfig | None = None) -> Split:
    """Load, split (stratified for classification) and standardize with training statistics (``notes``,
    ``preprocess``: see :func:`load_dataset`; a table's raw columns are split, not standardized: the preprocessing
    fitted by ``convert`` does it)."""
    from sklearn.model_selection import train_test_split

    notes = {} if notes is None else notes
    if data_loader(data) == "parquet":
        return stream_split(data, preprocess)
    X, y, names = load_dataset(data, notes, preprocess)
    table = not isinstance(X, np.ndarray)
    # images, token ids: the graph's own input, never standardized (no statistics: raw_X gives them back as they are)
    array = not table and (X.ndim > 2 or X.dtype.kind in "iu")
    kinds = notes.pop("kinds", [])
    task = str(data.task)
    seed = int(data.seed)
    classes = np.array([], dtype=np.float64)
    if task == "classification":  # the labels as they are (never re-encoded): the trainers map them to classes
        classes, y = class_labels(y, target_description(data))
    else:
        y = np.asarray(y, dtype=np.float64)
    stratify = y if task == "classification" else None
    X_rest, X_test, y_rest, y_test = train_test_split(X, y, test_size=data.test_size, random_state=seed,
                                                      stratify=stratify)
    if data.validation_fraction > 0:
        stratify = y_rest if task == "classification" else None
        X_train, X_valid, y_train, y_valid = train_test_split(
            X_rest, y_rest, test_size=data.validation_fraction, random_state=seed + 1, stratify=stratify)
    else:
        X_train, y_train = X_rest, y_rest
        X_valid, y_valid = X_rest[:0], y_rest[:0]
    if table:  # the raw columns: the fitted preprocessing scales them, inside the graph
        X_train, X_valid, X_test = (part.reset_index(drop=True) for part in (X_train, X_valid, X_test))
    return standardized_split(data, task, (X_train, y_train), (X_valid, y_valid), (X_test, y_test), names, classes,
                              plain=table or array, kinds=kinds)


def standardized_split(data: DictConfig, task: str, train: tuple, valid: tuple, test: tuple, names, classes,
                       plain: bool = False, kinds=(), stream: str = "") -> Split:
    """The Split of the ``(X, y)`` parts, standardized with the training part's statistics (``data.standardize``,
    ``data.standardize_target``); ``plain`` parts (a table's raw columns, images, tokens) are left as they are."""
    (X_train, y_train), (X_valid, y_valid), (X_test, y_test) = train, valid, test
    width = 0 if plain else X_train.shape[1]
    x_mean = X_train.mean(axis=0) if data.standardize and not plain else np.zeros(width)
    x_scale = X_train.std(axis=0) if data.standardize and not plain else np.ones(width)
    x_scale = np.where(x_scale > 0, x_scale, 1.0)
    if task == "regression" and data.standardize_target:
        y_mean, y_scale = float(y_train.mean()), float(y_train.std() or 1.0)
    else:
        y_mean, y_scale = 0.0, 1.0

    def fx(a: np.ndarray) -> np.ndarray:
        if plain:
            return a
        return ((a - x_mean) / x_scale).astype(np.float32)

    def fy(a: np.ndarray) -> np.ndarray:
        if task == "classification":
            return a
        return ((a - y_mean) / y_scale).astype(np.float32)

    return Split(
        task=task, X_train=fx(X_train), y_train=fy(y_train), X_valid=fx(X_valid), y_valid=fy(y_valid),
        X_test=fx(X_test), y_test=fy(y_test), x_mean=x_mean.astype(np.float32), x_scale=x_scale.astype(np.float32),
        y_mean=y_mean, y_scale=y_scale, feature_names=np.array(names, dtype=str), classes=classes,
        kinds=np.array(kinds, dtype=str), stream=stream,
    )


def stream_split(data: DictConfig, preprocess: DictConfig | None = None) -> Split:
    """``data=parquet``: the table split by a stable hash (:mod:`pipelines.data.streams`), never read whole; the
    Split holds the first ``data.sample_rows`` rows of each part and the description later stages stream the parts
    from. With ``preprocess=auto`` the samples are the raw columns (their kinds read from the training sample), the
    preprocessing ``convert`` fits scales them inside the graph; without, they are standardized with the training
    sample's statistics."""
    from dataclasses import replace

    from .streams import (constant_target, labels_by_file, labels_like, open_stream, raw_rows, sample, scan_labels,
                          stream_error)
    from .tables import column_kind, column_treatments, leave_out_row_labels, warn_many_levels

    stream, parts = open_stream(data, preprocess)
    treatments = column_treatments(preprocess)
    rows = int(data.sample_rows)
    kinds = None
    raw, y_raw, _ = parts["train"].head(rows)
    if not data.features:  # row indexes and identifiers (by the training sample): features only when named
        labels = leave_out_row_labels(raw, [c for c in stream.columns if c not in (treatments or {})],
                                      f"{stream.path} (its first {len(raw)} training rows)")
        if len(labels) == len(stream.columns):
            raise stream_error(f"{stream.path} has no feature column besides the target {stream.target!r} and the "
                               f"row labels {labels}")
        if labels:
            stream = replace(stream, columns=tuple(c for c in stream.columns if c not in labels))
            parts, raw = stream.parts(), raw.drop(columns=labels)
    if treatments is None:
        X_train, y_train = raw_rows(parts["train"], raw, y_raw, "sample")
    else:  # the kinds of the training sample's columns hold for every chunk of every part
        kinds = {c: column_kind(raw[c], treatments.get(c)) for c in stream.columns}
        warn_many_levels(raw, kinds, treatments, f"{stream.path} (its first {len(raw)} training rows)")
        X_train, y_train = raw_rows(parts["train"], raw, y_raw, "sample", kinds, stream.junk_cells)
    X_test, y_test = sample(parts["test"], rows, kinds, stream.junk_cells)
    X_valid, y_valid = (sample(parts["validation"], rows, kinds, stream.junk_cells) if "validation" in parts
                        else (X_train[:0], y_train[:0]))
    task = str(data.task)
    where = f"data.target={stream.target!r} of {stream.path}"
    classes = np.array([], dtype=np.float64)
    if task == "classification":
        classes, _ = class_labels(y_train, f"{where} (its first {len(y_train)} training rows)")
        found = labels_like(scan_labels(parts["train"]), classes)
        missing = sorted(set(found.tolist()) - set(classes.tolist()))
        if missing:
            raise stream_error(f"{where}: the training part holds the labels {missing[:10]} that its first {rows} "
                               "rows (data.sample_rows, where the start model is fitted) lack: raise data.sample_rows")
        trained = set(found.tolist())
        for part in ("validation", "test"):  # a class the training part never shows cannot be predicted, nor scored
            if part not in parts:
                continue
            for label, file in labels_by_file(parts[part]).items():
                label = labels_like(np.array([label]), classes)[0].item()
                if label not in trained:
                    raise stream_error(
                        f"{where}: the class {label!r} is in the {part} part (file {file}) and in no row of the "
                        "training part: no model trained on this split can predict it. Give it training rows (more "
                        "rows of it, or data.key=<a column> spreading them over the parts), or leave its rows out "
                        "of the table")
        y_train, y_valid, y_test = (labels_like(y, classes) for y in (y_train, y_valid, y_test))
    else:
        y_train, y_valid, y_test = (np.asarray(y, dtype=np.float64) for y in (y_train, y_valid, y_test))
        value = constant_target(stream)
        if value is not None:
            raise stream_error(f"{where} holds one value ({value:g}) in every row (the files' statistics): nothing to "
                               "learn (any model predicts it exactly); choose another target column")
    if len(y_train) < 2:
        raise stream_error(f"the training part of {stream.path} holds {len(y_train)} rows: too few to train on")
    return standardized_split(data, task, (X_train, y_train), (X_valid, y_valid), (X_test, y_test), stream.columns,
                              classes, plain=kinds is not None, kinds=list((kinds or {}).values()),
                              stream=stream.to_json())
