"""Tables for library users: the column kinds, the frame and the scikit-learn preprocessing the pipelines build
with ``preprocess=auto``, so a DataFrame with text, dates, integers and gaps trains without the pipelines::

    X = prepare_frame(frame)                                  # text gaps a category, booleans 0/1, dates datetime64
    kinds = column_kinds(X)
    model = make_pipeline(make_preprocessing(kinds), SGDRegressor(max_iter=5)).fit(X, y)
    trainer = OrtGradientOptimizer(add_loss_output(to_onnx(model, X)), max_iter=50).fit(X, y)
    trainer.predict(prepare_frame(new_rows, kinds=kinds))

:func:`column_kind` names a column's kind (:data:`KINDS`), :func:`prepare_frame` converts the columns to the form the
preprocessing and the graph take (a text gap becomes the category :data:`TEXT_MISSING`: scikit-learn's imputers
before a ``OneHotEncoder`` do not convert to ONNX), :func:`make_preprocessing` is the ``ColumnTransformer`` fitted in
front of the model. Light: numpy here, pandas and scikit-learn imported when used.
"""

from __future__ import annotations

import numpy as np

#: the text a missing cell of a text column becomes (a category of its own), in training and in the served model
TEXT_MISSING = "__missing__"
#: the kinds of columns a table holds
KINDS = ("number", "bool", "text", "date")
#: the treatments of a column (``treatments``), and the kind each gives by default
TREATMENTS = ("scale", "passthrough", "onehot", "ordinal", "date", "drop")
DEFAULT_TREATMENT = {"number": "scale", "bool": "passthrough", "text": "onehot", "date": "date"}
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def column_kind(column, treatment: str | None = None) -> str:
    """The kind (:data:`KINDS`) of a raw pandas column: ``treatment`` first (onehot/ordinal make text, date a date,
    scale a number, passthrough a number or a boolean), else its dtype; a text column whose values are all ISO
    dates is a date. A text column whose cells are mostly numbers (:func:`ortflow.convert.tables.is_number_text`: ``?``
    among numbers, ``1,234.5``, ``12,5``) is a number: :func:`prepare_frame` reads the separators, names the junk
    cells or makes them gaps."""
    import pandas as pd

    if treatment in ("onehot", "ordinal"):
        return "text"
    if treatment == "date":
        return "date"
    if treatment == "scale":
        return "number"
    if treatment == "passthrough":
        return "bool" if column_kind(column) == "bool" else "number"
    kind = column.dtype.kind
    if kind == "M":
        return "date"
    if kind == "b" or (kind == "O" and len(column.dropna()) and column.dropna().map(type).eq(bool).all()):
        return "bool"
    if kind in "iuf":
        return "number"
    from ..convert.tables import is_number_text

    if is_number_text(column):  # numbers but for junk cells ('?'), or with separators (1,234.5): those cells named
        return "number"
    present = column.dropna().astype(str)
    if len(present) and present.str.match(r"^\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?$").all():
        if pd.to_datetime(present, errors="coerce", format="ISO8601").notna().all():
            return "date"
    return "text"


def column_kinds(frame, treatments: dict[str, str] | None = None) -> dict[str, str]:
    """Each column's kind (:func:`column_kind`), in the frame's order."""
    return {name: column_kind(frame[name], (treatments or {}).get(name)) for name in frame.columns}


def prepare_frame(frame, treatments: dict[str, str] | None = None, kinds: dict[str, str] | None = None,
                  where: str = "the frame", junk_cells: str = "refuse", junk_option: str = "junk_cells='gap'",
                  rows: np.ndarray | None = None):
    """The columns of ``frame`` in the form :func:`make_preprocessing` and the graph take, by kind
    (:func:`column_kind`, or ``kinds``, the kinds fixed earlier: pass the training frame's to later frames):
    numbers float64 (gaps NaN), booleans 0/1 float64, text strings (gaps :data:`TEXT_MISSING`), dates
    ``datetime64[ns]`` (gaps NaT). A column the treatment makes a date holding a cell that does not parse, or a
    number beyond float32's range, is a ValueError naming the column (``where`` names the frame). The cells of a
    number column that are not numbers (``?``, ``n.a.``) are a ValueError naming them with ``junk_cells='refuse'``
    (the default; ``junk_option`` is how the caller spells the other choice, for the message); with ``'gap'`` they
    become gaps (the preprocessing imputes them), a warning naming the column, their count and the first of them.
    Numbers written with separators (``1,234.5``, ``12,5``) are read by the convention the column follows
    (:func:`ortflow.convert.tables.read_numbers`), a warning naming it; a column whose separators read two ways
    (``1,234`` alone) is a ValueError naming it, as is a date whose day and month may be swapped (``04/03/2021``,
    which the served model refuses too). ``rows``: each row's number as messages give it (the file's rows),
    else counted from 1."""
    import pandas as pd

    treatments, kinds = treatments or {}, kinds or {}
    out = {}
    for name in frame.columns:
        column = frame[name]
        kind = kinds.get(name) or column_kind(column, treatments.get(name))
        if kind == "number":
            if column.dtype.kind not in "fiu":  # text or objects: parsed, a cell that is no number named
                from ..convert.tables import CONVENTIONS, read_numbers

                parsed, convention = read_numbers(column, name, where, rows)
                if convention is not None:
                    _note(f"column {name!r} of {where} holds numbers written with separators: read with "
                          f"{CONVENTIONS[convention]}")
                bad = np.isnan(parsed) & column.notna().to_numpy()
                if bad.any():
                    _junk(column, bad, name, where, junk_cells, junk_option, rows)
                column = pd.Series(parsed, index=column.index)
            # gaps NaN (the graph's imputer fills them); pandas' own dtypes (Int64, Arrow) mark them otherwise
            values = (column.to_numpy(np.float64) if isinstance(column.dtype, np.dtype)
                      else column.to_numpy(np.float64, na_value=np.nan))
            large = np.flatnonzero(np.abs(values) > _FLOAT32_MAX)
            if len(large):
                number = large[0] + 1 if rows is None else rows[large[0]]
                raise ValueError(f"column {name!r} of {where} holds {values[large[0]]:g} at data row "
                                 f"{number}: beyond float32's range (±3.4e38), which the model computes in")
            out[name] = values
        elif kind == "bool":
            out[name] = column.map({True: 1.0, False: 0.0}).astype(np.float64)
        elif kind == "date":
            from ..convert.tables import ambiguous_dates, describe_cells

            swapped = ambiguous_dates(column)
            if swapped.any():
                raise ValueError(f"column {name!r} of {where} holds dates whose day and month may be swapped "
                                 f"({describe_cells(column, swapped, rows=rows)}): write them as ISO text, "
                                 "YYYY-MM-DD (the served model refuses such dates too)")
            values = pd.to_datetime(column, errors="coerce", format="mixed") if column.dtype.kind != "M" else column
            bad = values.isna() & column.notna()
            if bad.any():
                raise ValueError(f"column {name!r} of {where} holds {column[bad].iloc[0]!r}, not a date")
            if getattr(values.dt, "tz", None) is not None:
                values = values.dt.tz_convert(None)
            out[name] = values.astype("datetime64[ns]")
        else:
            text = column.map(_text, na_action="ignore")
            out[name] = text.fillna(TEXT_MISSING).astype(object)
    return pd.DataFrame(out, index=frame.index, copy=False)


_NOTED: set[str] = set()


def _note(line: str) -> None:
    """A warning said once per process (the chunks of a streamed table each go through :func:`prepare_frame`)."""
    if line not in _NOTED:
        _NOTED.add(line)
        import logging

        logging.getLogger("ortflow").warning("%s", line)


def _junk(column, bad: np.ndarray, name: str, where: str, junk_cells: str, junk_option: str,
          rows: np.ndarray | None = None) -> None:
    """The cells of a number column that are not numbers: a ValueError naming them (``junk_cells='refuse'``), or a
    warning saying they are read as gaps (``'gap'``)."""
    import logging

    from ..convert.tables import describe_cells

    what = (f"column {name!r} of {where} is numbers but for {int(bad.sum())} of {len(bad)} cells "
            f"({describe_cells(column, bad, rows=rows)}; rows counted from the first data row)")
    if junk_cells == "gap":
        logging.getLogger("ortflow").warning("%s: read as gaps, which the preprocessing imputes (%s)", what,
                                             junk_option)
        return
    raise ValueError(f"{what}: fix those cells, {junk_option} reads them as gaps (imputed), or treat the column as "
                     "text (onehot or ordinal)")


def _text(value) -> str:
    """A cell as text: an integral float (an integer column with gaps, read as floats) without its ``.0``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def make_preprocessing(kinds: dict[str, str], treatments: dict[str, str] | None = None):
    """The ColumnTransformer fitted in front of the model, from each column's kind (:func:`column_kind`) and its
    treatment (``treatments``, else the kind's, :data:`DEFAULT_TREATMENT`): ``scale`` (numbers: median imputation,
    standardization), ``passthrough`` (numbers and booleans: imputation only, the most frequent value), ``onehot``
    (text: unknown values ignored; gaps are the category :data:`TEXT_MISSING`), ``ordinal`` (text: one number per
    category, unknown values -1), ``date`` (:class:`ortflow.convert.tables.DateParts`: year, month, day, weekday, day of
    year; imputed, standardized) and ``drop``. Dense output (``sparse_threshold=0``); it converts to ONNX with
    :func:`ortflow.to_onnx` (one graph input per column)."""
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

    from ..convert.tables import DateParts

    steps = {
        "scale": lambda: make_pipeline(SimpleImputer(strategy="median"), StandardScaler()),
        "passthrough": lambda: SimpleImputer(strategy="most_frequent"),
        "onehot": lambda: OneHotEncoder(handle_unknown="ignore"),
        "ordinal": lambda: OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=-1),
        "date": lambda: make_pipeline(DateParts(), SimpleImputer(strategy="median"), StandardScaler()),
    }
    groups: dict[str, list[str]] = {}
    for column, kind in kinds.items():
        treatment = (treatments or {}).get(column) or DEFAULT_TREATMENT[kind]
        if treatment not in TREATMENTS:
            raise ValueError(f"column {column!r}: treatment {treatment!r} is not one of {list(TREATMENTS)}")
        if treatment != "drop":
            groups.setdefault(treatment, []).append(column)
    return ColumnTransformer([(name, steps[name](), columns) for name, columns in groups.items()],
                             sparse_threshold=0)
