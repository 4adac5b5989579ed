"""Your own data (``data=file``): a CSV or Parquet table read and checked, then turned into features and a target.

Nothing is dropped silently. By default a column that is not numeric, a row with a missing or non-finite value and
a target the task cannot use stop the command with a
:class:`~pipelines.base.errors.DataError` naming them; ``data.drop_invalid=true`` drops such columns and rows instead,
with a warning, and the counts go into :class:`Table` (the ``convert`` stage logs them).

Light on purpose (pandas and numpy, no MLflow, no scikit-learn): the entry points call :func:`read_table` before
anything else, so a missing file, a wrong target column or unusable labels fail at once, before any run exists.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

from ..base.errors import DataError
from ..base.paths import user_path

_log = logging.getLogger("pipelines.data.tables")
SUFFIXES = {".csv": "csv", ".txt": "csv", ".parquet": "parquet", ".pq": "parquet"}
#: fewest rows a split into train, validation and test can take
MIN_ROWS = 10


@dataclass
class Table:
    """Features (float64) and target of a checked table, and what was dropped on the way."""

    X: np.ndarray
    y: np.ndarray
    features: list[str]
    path: Path
    n_rows_read: int
    dropped_columns: list[str] = field(default_factory=list)
    n_rows_dropped: int = 0

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


def read_table(data: DictConfig) -> Table:
    """Read ``data.path`` and check it against ``data.target``, ``data.features``, ``data.task`` and
    ``data.drop_invalid``; raises :class:`DataError` naming the problem.

    The last table read is kept: the entry point's early check, the chain's pre-check and ``convert`` read the
    file once (and warn once), unless it changed in between."""
    path = table_path(data)  # before importing pandas: a missing file is reported at once
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size, str(data.target), tuple(data.features or ()),
           str(data.task), bool(data.get("drop_invalid", False)))
    if key not in _LAST:
        _LAST.clear()
        _LAST[key] = _read(path, data)
    return _LAST[key]


_LAST: dict[tuple, Table] = {}


def _read(path: Path, data: DictConfig) -> Table:
    import pandas as pd

    try:
        frame = pd.read_parquet(path) if SUFFIXES[path.suffix.lower()] == "parquet" else pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001 - any reader failure is the file's problem
        raise DataError(f"data.path={data.path!r}: {path.name} cannot be read as "
                        f"{SUFFIXES[path.suffix.lower()]}: {type(exc).__name__}: {exc}") from exc
    frame.columns = [str(c) for c in frame.columns]
    target = str(data.target)
    if target not in frame.columns:
        raise DataError(f"data.target={target!r} is not a column of {path.name}; its columns: "
                        f"{_names(frame.columns)}")
    drop = bool(data.get("drop_invalid", False))
    features, dropped = _feature_columns(frame, data, path.name, drop)
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
    _check_rows(y, path.name)
    return Table(X, y, features, path, len(frame), dropped, n_bad)


def _feature_columns(frame, data: DictConfig, file: str, drop: bool) -> tuple[list[str], list[str]]:
    """The feature columns, and the non-numeric ones left out (only with ``drop``)."""
    target = str(data.target)
    if data.features:
        columns = [str(c) for c in data.features]
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise DataError(f"data.features names columns {missing} missing from {file}; its columns: "
                            f"{_names(frame.columns)}")
        if target in columns:
            raise DataError(f"data.features includes the target {target!r}")
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
    return column.astype(np.float64).to_numpy()


def _target_present(y: np.ndarray) -> np.ndarray:
    """Rows whose target is usable: finite numbers, or labels that are not missing."""
    if y.dtype.kind in "fc":
        return np.isfinite(y)
    if y.dtype.kind in "iub":
        return np.ones(len(y), dtype=bool)
    import pandas as pd

    return ~pd.isna(y)


def _check_rows(y: np.ndarray, file: str) -> None:
    """Enough rows for the split; a classification target's labels are checked by :mod:`pipelines.data.labels`."""
    if len(y) < MIN_ROWS:
        raise DataError(f"{file} has {len(y)} usable rows: at least {MIN_ROWS} are needed to split train, "
                        "validation and test")


def _numeric(column) -> bool:
    return column.dtype.kind in "iufb"


def _names(columns, shown: int = 20) -> str:
    columns = [str(c) for c in columns]
    return str(columns[:shown])[:-1] + (f", ... ({len(columns)} in all)]" if len(columns) > shown else "]")
