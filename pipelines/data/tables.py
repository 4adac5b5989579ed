"""Your own data (``data=file``): a CSV or Parquet table read and checked, then turned into features and a target.

Nothing is dropped silently. By default a column that is not numeric, a row with a missing or non-finite value and
a target the task cannot use stop the command with a
:class:`~pipelines.base.errors.DataError` naming them; ``data.drop_invalid=true`` drops such columns and rows instead,
with a warning, and the counts go into :class:`Table` (the ``convert`` stage logs them).

With ``preprocess=auto`` (the default) the table keeps its columns as they are (:func:`table_frame`): numbers as
float64 with their gaps, booleans as 0/1 floats, text as strings whose gaps are the category :data:`TEXT_MISSING`,
dates (datetime columns, or text columns holding only ISO dates) as ``datetime64``; the ``convert`` stage fits
the preprocessing that turns them into features. Only a row whose target is missing is refused (or dropped).

Light on purpose (pandas and numpy, no MLflow, no scikit-learn): the entry points call :func:`read_table` before
anything else, so a missing file, a wrong target column or unusable labels fail at once, before any run exists.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

# TEXT_MISSING: a text gap's category; KINDS: the kinds of columns a table holds with preprocess=auto
from ortflow.data.preprocessing import KINDS, TEXT_MISSING  # noqa: F401  (numpy only: the module stays light)

from ..base.errors import DataError
from ..base.paths import user_path

_FLOAT32_MAX = float(np.finfo(np.float32).max)

_log = logging.getLogger("pipelines.data.tables")
SUFFIXES = {".csv": "csv", ".txt": "csv", ".parquet": "parquet", ".pq": "parquet"}
#: fewest rows a split into train, validation and test can take
MIN_ROWS = 10


@dataclass
class Table:
    """Features (float64, or with ``preprocess=auto`` a DataFrame of the raw columns) and target of a checked
    table, and what was dropped on the way."""

    X: "np.ndarray | object"
    y: np.ndarray
    features: list[str]
    path: Path
    n_rows_read: int
    dropped_columns: list[str] = field(default_factory=list)
    n_rows_dropped: int = 0
    kinds: dict[str, str] = field(default_factory=dict)  # preprocess=auto: each feature column's kind (KINDS)

    def report(self) -> dict:
        """What the ``convert`` stage logs: counts as numbers, the column names as text."""
        return {"n_rows_read": self.n_rows_read, "n_rows_dropped": self.n_rows_dropped,
                "n_columns_dropped": len(self.dropped_columns), "dropped_columns": ",".join(self.dropped_columns)}


def table_path(data: DictConfig) -> Path:
    """``data.path`` resolved (relative to the directory the command started from); a DataError unless it is an
    existing .csv or .parquet file."""
    path = user_path(str(data.path))
    if path.suffix.lower() not in SUFFIXES:
        raise DataError(f"data.path={data.path!r}: use a .csv or .parquet file (suffixes {sorted(SUFFIXES)})")
    if not path.is_file():
        raise DataError(f"data.path={data.path!r}: {path} does not exist")
    return path


def read_table(data: DictConfig, preprocess: DictConfig | None = None) -> Table:
    """Read ``data.path`` and check it against ``data.target``, ``data.features``, ``data.task`` and
    ``data.drop_invalid``; raises :class:`DataError` naming the problem. ``preprocess``: the config group of that
    name; with ``preprocess.name=auto`` the features are the raw columns (:func:`table_frame`), None or ``none``:
    numbers only.

    The last table read is kept: the entry point's early check, the chain's pre-check and ``convert`` read the
    file once (and warn once), unless it changed in between."""
    path = table_path(data)  # before importing pandas: a missing file is reported at once
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size, str(data.target), tuple(data.features or ()),
           str(data.task), bool(data.get("drop_invalid", False)), str(data.get("junk_cells", "refuse")),
           _treatments(preprocess))
    if key not in _LAST:
        _LAST.clear()
        _LAST[key] = _read(path, data) if key[-1] is None else _read_raw(path, data, dict(key[-1]))
    return _LAST[key]


def column_treatments(preprocess: DictConfig | None) -> dict[str, str] | None:
    """None without preprocessing (numbers only), else ``preprocess.columns``: ``{column: treatment}``."""
    if preprocess is None or str(preprocess.name) != "auto":
        return None
    return {str(k): str(v) for k, v in (preprocess.get("columns") or {}).items()}


def _treatments(preprocess: DictConfig | None) -> tuple | None:
    """:func:`column_treatments` as a sorted tuple (a key of the table read last)."""
    treatments = column_treatments(preprocess)
    return None if treatments is None else tuple(sorted(treatments.items()))


_LAST: dict[tuple, Table] = {}


def _load(path: Path, data: DictConfig):
    import pandas as pd

    try:
        # page checksums verified where the writer stored them: a flipped bit is refused, not read as other numbers
        frame = (pd.read_parquet(path, page_checksum_verification=True) if SUFFIXES[path.suffix.lower()] == "parquet"
                 else pd.read_csv(path))
    except Exception as exc:  # noqa: BLE001 - any reader failure is the file's problem
        raise DataError(f"data.path={data.path!r}: {path.name} cannot be read as "
                        f"{SUFFIXES[path.suffix.lower()]}: {type(exc).__name__}: {exc}") from exc
    header = _csv_header(path) if SUFFIXES[path.suffix.lower()] == "csv" else [str(c) for c in frame.columns]
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:  # pandas renames a CSV's repeated names (a, a.1): which one is meant is the user's to say
        raise DataError(f"{path.name} has several columns named {repeated}: rename them so that each name is one "
                        "column's")
    frame.columns = [str(c) for c in frame.columns]
    target = str(data.target)
    if target not in frame.columns:
        raise DataError(f"data.target={target!r} is not a column of {path.name}; its columns: "
                        f"{_names(frame.columns)}")
    return frame


def _csv_header(path: Path) -> list[str]:
    """The column names of a CSV file as written (pandas renames repeated ones)."""
    import csv

    with open(path, newline="", encoding="utf-8", errors="replace") as handle:
        return next(csv.reader(handle), [])


def _read_raw(path: Path, data: DictConfig, treatments: dict[str, str]) -> Table:
    """The table with ``preprocess=auto``: every feature column kept (:func:`table_frame`); rows without a target
    refused, or dropped with ``data.drop_invalid``."""
    frame = _load(path, data)
    target = str(data.target)
    unknown = sorted(set(treatments) - set(frame.columns))
    if unknown:
        raise DataError(f"preprocess.columns names columns {unknown} missing from {path.name}; its columns: "
                        f"{_names(frame.columns)}")
    named = _named_features(frame, data, path.name)
    features = named or [c for c in frame.columns if c != target]
    dropped = [c for c in features if treatments.get(c) == "drop"]
    if not named:  # row numbers and identifiers: features only when the user names them
        dropped += leave_out_row_labels(frame, [c for c in features if c not in treatments], path.name)
    features = [c for c in features if c not in dropped]
    if not features:
        raise DataError(f"{path.name} has no feature column besides the target {target!r}")
    y = _target(frame[target], str(data.task), target, path.name)
    valid = _target_present(y)
    n_bad = int((~valid).sum())
    if n_bad and not bool(data.get("drop_invalid", False)):
        raise DataError(f"{n_bad} of {len(frame)} rows of {path.name} have no target {target!r} (first at data row "
                        f"{int(np.flatnonzero(~valid)[0]) + 1}): fill it, or data.drop_invalid=true drops those rows")
    if n_bad:
        _log.warning("%s: %d of %d rows dropped (no target)", path.name, n_bad, len(frame))
    raw = frame.loc[valid, features].reset_index(drop=True)
    kinds = {c: column_kind(raw[c], treatments.get(c)) for c in features}
    warn_many_levels(raw, kinds, treatments, path.name)
    # messages count rows as the file has them, whatever rows without a target were dropped
    X = table_frame(raw, treatments, path.name, kinds, str(data.get("junk_cells", "refuse")),
                    rows=np.flatnonzero(valid) + 1)
    y = y[valid]
    if y.dtype == object:
        y = y.astype(str)
    _check_rows(y, path.name, str(data.task), target)
    return Table(X, y, features, path, len(frame), dropped, n_bad, kinds)


def column_kind(column, treatment: str | None = None) -> str:
    """The kind (:data:`KINDS`) of a raw column (:func:`ortflow.data.preprocessing.column_kind`): ``treatment``
    (``preprocess.columns``) first, else its dtype; a column of numbers but for a few cells is a number."""
    from ortflow.data.preprocessing import column_kind as kind_of

    return kind_of(column, treatment)


def table_frame(frame, treatments: dict[str, str] | None = None, file: str = "the table",
                kinds: dict[str, str] | None = None, junk_cells: str = "refuse", rows: np.ndarray | None = None):
    """The feature columns in the form the preprocessing and the graph take, by kind
    (:func:`ortflow.data.preprocessing.prepare_frame`; ``kinds``, the kinds fixed earlier: a streamed table's chunks
    take those of its first rows). A date that does not parse, a number beyond float32, or the cells of a number
    column that are not numbers (``?``, ``n.a.``) with ``junk_cells="refuse"`` (``data.junk_cells``) are a DataError
    naming them; with ``"gap"`` those cells become gaps, with a warning. ``rows``: each row's number in the file
    (messages name those), else counted from 1."""
    from ortflow.data.preprocessing import prepare_frame

    try:
        return prepare_frame(frame, treatments, kinds, where=file, junk_cells=junk_cells,
                             junk_option="data.junk_cells=gap", rows=rows)
    except ValueError as exc:
        raise DataError(str(exc)) from exc


#: a text column is named when it has at least this many levels and one for at least half its rows (an identifier?)
MANY_LEVELS = 50


def warn_many_levels(frame, kinds: dict[str, str], treatments: dict[str, str], file: str) -> None:
    """A warning for each text column (its kind from its cells, no treatment chosen) with a level for at least half
    its rows: one-hot encoding makes a weight per level, learned from one or two rows each."""
    for name, kind in kinds.items():
        if kind != "text" or name in treatments:
            continue
        levels, rows = frame[name].nunique(), int(frame[name].notna().sum())
        if levels >= MANY_LEVELS and levels * 2 >= rows:
            _log.warning("column %r of %s is text with %d levels in %d rows: one-hot encoding gives each level a "
                         "weight learned from about %.1f rows (an identifier? %s leaves it out; a number read as "
                         "text? fix its cells)", name, file, levels, rows, rows / levels, treatment_override(name, "drop"))


#: names pandas (an unnamed first column: ``to_csv``'s index) and R (``write.csv``, Rdatasets) give a row index
_ROW_INDEX_NAME = re.compile(r"^(Unnamed: \d+|rownames|row\.names|__index_level_\d+__|)$")
#: names of identifiers: a column so named with a value per row is one
_ID_NAME = re.compile(r"^(id|.*[_ .-]id|.*[a-z]Id|.*ID|key|uuid|guid)$", re.IGNORECASE)


def treatment_override(column: str, treatment: str) -> str:
    """The override that gives ``column`` a treatment, as a command line takes it (Hydra adds a key with ``+``);
    a name Hydra cannot take as a key: ``data.features=[...]``."""
    if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", column):
        return f"+preprocess.columns.{column}={treatment}"
    return "data.features=[...] naming the columns to use"


def row_labels(frame, columns: list[str]) -> dict[str, str]:
    """``{column: why}`` for the columns that label rows rather than describe them, each with a distinct value in
    every row (at least :data:`MIN_ROWS`): an integer sequence 0, 1, 2... or 1, 2, 3... in file order, integers or
    text named as pandas or R name a row index (``Unnamed: 0``, ``rownames``), text (at least :data:`MANY_LEVELS`
    rows), integers or text named as an identifier (``id``, ``customer_id``)."""
    found = {}
    n = len(frame)
    for name in columns:
        column = frame[name]
        values = column.to_numpy()
        if n < MIN_ROWS or column.isna().any() or column.nunique() != n:
            continue  # a label has a distinct value in every row
        whole = values.dtype.kind in "iu" or (values.dtype.kind == "f" and bool((values == np.round(values)).all()))
        if values.dtype.kind in "OSU" and column_kind(column) != "text":
            continue  # numbers written as text, dates: values, not labels
        if whole and values[0] in (0, 1) and np.array_equal(values, np.arange(values[0], values[0] + n)):
            found[name] = f"row numbers ({int(values[0])}, {int(values[0]) + 1}, ... in file order)"
        elif (whole or values.dtype.kind in "OSU") and _ROW_INDEX_NAME.match(str(name)):
            found[name] = "a row index (named as pandas or R write one, a distinct value in every row)"
        elif values.dtype.kind in "OSU" and n >= MANY_LEVELS:
            found[name] = "text with a distinct value in every row (an identifier)"
        elif (whole or values.dtype.kind in "OSU") and _ID_NAME.match(str(name)):
            found[name] = "named as an identifier, with a distinct value in every row"
    return found


def leave_out_row_labels(frame, columns: list[str], file: str) -> list[str]:
    """The columns of :func:`row_labels`, each named in a warning saying how to keep it: a model would learn the
    row order (a file sorted by its target gives the label away) and the served model would require them."""
    found = row_labels(frame, columns)
    for name, why in found.items():
        _log.warning("column %r of %s is %s: left out of the features (to use it: %s)", name, file, why,
                     treatment_override(name, "scale" if frame[name].dtype.kind in "iuf" else "onehot"))
    return list(found)


def _read(path: Path, data: DictConfig) -> Table:
    frame = _load(path, data)
    target = str(data.target)
    drop = bool(data.get("drop_invalid", False))
    features, dropped = _feature_columns(frame, data, path.name, drop)
    if not data.features:  # row numbers and identifiers: features only when data.features names them
        labels = leave_out_row_labels(frame, features, path.name)
        features, dropped = [c for c in features if c not in labels], dropped + labels
        if not features:
            raise DataError(f"{path.name} has no numeric feature column besides the target {target!r}")
    y = _target(frame[target], str(data.task), target, path.name)
    X = frame[features].astype(np.float64).to_numpy()
    cells = np.column_stack([np.isfinite(X), _target_present(y)])
    valid = cells.all(axis=1)
    n_bad = int((~valid).sum())
    if n_bad and not drop:
        bad_cols = [c for c, ok in zip([*features, target], cells.all(axis=0)) if not ok]
        first = int(np.flatnonzero(~valid)[0])
        raise DataError(f"{n_bad} of {len(frame)} rows of {path.name} have a missing or non-finite value "
                        f"(columns {_names(bad_cols)}; first at data row {first + 1}): fix them, or "
                        "data.drop_invalid=true drops those rows")
    if n_bad:
        _log.warning("%s: %d of %d rows dropped (missing or non-finite values)", path.name, n_bad, len(frame))
        X, y = X[valid], y[valid]
    if y.dtype == object:  # text labels (pandas keeps them as objects): compared and sorted as strings
        y = y.astype(str)
    _check_rows(y, path.name, str(data.task), target)
    return Table(X, y, features, path, len(frame), dropped, n_bad)


def _feature_columns(frame, data: DictConfig, file: str, drop: bool) -> tuple[list[str], list[str]]:
    """The feature columns, and the non-numeric ones left out (only with ``drop``)."""
    target = str(data.target)
    columns = _named_features(frame, data, file)
    if columns:
        text = [c for c in columns if not _numeric(frame[c])]
        if text:
            raise DataError(f"data.features names non-numeric columns {text} of {file}: encode them as numbers "
                            "or leave them out of data.features")
        return columns, []
    columns = [c for c in frame.columns if c != target]
    text = [c for c in columns if not _numeric(frame[c])]
    if text and not drop:
        raise DataError(f"{file} has non-numeric columns {_names(text)}: encode them as numbers, list the "
                        "columns to use in data.features=[...], or data.drop_invalid=true leaves them out")
    if text:
        _log.warning("%s: non-numeric columns left out: %s", file, text)
    features = [c for c in columns if c not in text]
    if not features:
        raise DataError(f"{file} has no numeric feature column besides the target {target!r}")
    return features, text


def _named_features(frame, data: DictConfig, file: str) -> list[str]:
    """``data.features`` checked against the table (columns of it, not the target); [] when not set."""
    if not data.features:
        return []
    columns = [str(c) for c in data.features]
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise DataError(f"data.features names columns {missing} missing from {file}; its columns: "
                        f"{_names(frame.columns)}")
    if str(data.target) in columns:
        raise DataError(f"data.features includes the target {data.target!r}")
    return columns


def _target(column, task: str, target: str, file: str) -> np.ndarray:
    if task == "classification":
        return column.to_numpy()
    if not _numeric(column):
        import pandas as pd

        values = pd.to_numeric(column, errors="coerce")
        text = column[values.isna() & column.notna()]
        if len(text):
            raise DataError(f"data.target={target!r} of {file} holds text ({text.iloc[0]!r} ...): a regression "
                            "target must be numbers; for labels set data.task=classification (and a classifier)")
        column = values
    values = column.astype(np.float64).to_numpy()
    check_float32(values, f"the target {target!r}", file)
    return values


def check_float32(values: np.ndarray, what: str, file: str) -> None:
    """A DataError naming the first value of ``what`` (a feature column, the target) beyond float32's range, which
    the model computes in: it would train to infinities or fail after training."""
    large = np.flatnonzero(np.abs(values) > _FLOAT32_MAX)
    if len(large):
        raise DataError(f"{what} of {file} holds {values[large[0]]:g} at data row {large[0] + 1}: beyond float32's "
                        "range (±3.4e38), which the model computes in")


def _target_present(y: np.ndarray) -> np.ndarray:
    """Rows whose target is usable: finite numbers, or labels that are not missing."""
    if y.dtype.kind in "fc":
        return np.isfinite(y)
    if y.dtype.kind in "iub":
        return np.ones(len(y), dtype=bool)
    import pandas as pd

    return ~pd.isna(y)


def _check_rows(y: np.ndarray, file: str, task: str, target: str) -> None:
    """Enough rows for the split, and a regression target that varies (a constant one leaves nothing to learn:
    every model scores perfectly); a classification target's labels are checked by :mod:`pipelines.data.labels`."""
    if len(y) < MIN_ROWS:
        raise DataError(f"{file} has {len(y)} usable rows: at least {MIN_ROWS} are needed to split train, "
                        "validation and test")
    if task == "regression" and np.ptp(y) == 0:
        raise DataError(f"data.target={target!r} of {file} holds one value ({y[0]:g}) in all {len(y)} rows: nothing "
                        "to learn (any model predicts it exactly); choose another target column")


def _numeric(column) -> bool:
    return column.dtype.kind in "iufb"


def _names(columns, shown: int = 20) -> str:
    columns = [str(c) for c in columns]
    return str(columns[:shown])[:-1] + (f", ... ({len(columns)} in all)]" if len(columns) > shown else "]")
