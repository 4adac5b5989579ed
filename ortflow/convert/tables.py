"""Dates in tables: ``DateParts``, a scikit-learn transformer splitting dates into year, month, day, weekday and day
of year, with the skl2onnx converter that computes the same parts in ONNX.

A date reaches an ONNX graph as an int64: the number of days since 1970-01-01 (:func:`to_days`; the time of day is
dropped, a date before 1970 is negative, a missing date ``NaT`` is the smallest int64). :mod:`ortflow.data.inputs` feeds a
``datetime64`` column to an int64 input that way, and :func:`ortflow.convert.sklearn.table_input_types` declares a
datetime column as such an input. The parts come from the day count with Howard Hinnant's ``civil_from_days``
(integer ``Div`` and ``Mod`` only), written once (:func:`date_parts`) over numpy for ``transform`` and over ONNX
nodes for the converter, so both give the same numbers; a missing date gives NaN parts (an imputer after
``DateParts`` fills them).
"""

from __future__ import annotations

import re

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin

#: the parts DateParts can write, in the order of ``DateParts.parts``' default; weekday: Monday=0 (pandas' dayofweek)
PARTS = ("year", "month", "day", "weekday", "dayofyear")
#: the day count of a missing date (NaT as int64)
MISSING_DAY = np.iinfo(np.int64).min


#: a text column is numbers when at least this share of its present cells are numbers (its other cells are junk
#: named: refused, or read as gaps); below it, text
NUMERIC_SHARE = 0.5
#: how the separators of a column of numbers written as text read (:func:`read_numbers`), as messages name them
CONVENTIONS = {"thousands": "',' separating thousands, '.' the decimal point (1,234.5)",
               "decimal_comma": "',' the decimal point, '.' or a space separating thousands (1.234,5)"}
_SPACED = re.compile(r"^[+-]?\d{1,3}([ \u00a0\u202f]\d{3})+([.,]\d+)?$")  # 1 234,5: spaces only group digits
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?$")  # 1,234 and 1,234.5
_DECIMAL_COMMA = re.compile(r"^[+-]?(\d+|\d{1,3}(\.\d{3})+),\d+$")  # 1,234 and 12,5 and 1.234,5
_DOT_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(\.\d{3})+$")  # 1.234: 1234 where ',' is the decimal point


def _number_cells(column):
    """``(numbers, convention, ambiguous, present)`` of a text column (None for any other): ``numbers`` the cells
    as float64 (NaN where a cell is no number or a gap) read with the ``convention`` (:data:`CONVENTIONS`, None
    when no cell has a separator) their separators follow; ``ambiguous`` the cells that convention cannot read one
    way only (``1,234`` without a cell saying which ',' it is, ``1.234`` among decimal commas; any cell with a
    separator when the column has both conventions)."""
    import pandas as pd

    if getattr(column.dtype, "kind", "O") in "biufcmM" or isinstance(column.dtype, pd.CategoricalDtype):
        return None
    present = column.notna().to_numpy()
    if not present.any() or column[present].map(type).eq(bool).all():
        return None
    numbers = pd.to_numeric(column, errors="coerce").to_numpy(np.float64, na_value=np.nan, copy=True)
    text = column.map(lambda v: v.strip() if isinstance(v, str) else "", na_action="ignore").fillna("")
    text = text.where(~text.str.match(_SPACED), text.str.replace(r"[ \u00a0\u202f]", "", regex=True))
    unread = np.isnan(numbers) & present
    thousands = text.str.match(_THOUSANDS).to_numpy(bool) & unread
    decimal = text.str.match(_DECIMAL_COMMA).to_numpy(bool) & unread
    spaced = unread & ~thousands & ~decimal & (pd.to_numeric(text, errors="coerce").notna().to_numpy())
    numbers[spaced] = pd.to_numeric(text[spaced]).to_numpy(np.float64)
    ambiguous = np.zeros(len(column), dtype=bool)
    if not (thousands | decimal).any():
        return numbers, None, ambiguous, present
    only_thousands, only_decimal = thousands & ~decimal, decimal & ~thousands
    if only_thousands.any() and only_decimal.any():  # both conventions in one column: no cell can be trusted
        return numbers, None, thousands | decimal, present
    if only_thousands.any():
        numbers[thousands] = pd.to_numeric(text[thousands].str.replace(",", "")).to_numpy(np.float64)
        return numbers, "thousands", ambiguous, present
    if only_decimal.any():
        numbers[decimal] = pd.to_numeric(text[decimal].str.replace(".", "").str.replace(",", ".")).to_numpy(
            np.float64)
        dotted = text.str.match(_DOT_THOUSANDS).to_numpy(bool) & present & ~decimal
        return numbers, "decimal_comma", dotted, present
    return numbers, None, thousands & decimal, present  # only 1,234-like cells: thousands or a decimal comma?


def is_number_text(column) -> bool:
    """Whether a text column holds numbers: at least :data:`NUMERIC_SHARE` of its present cells are numbers (plain,
    or written with separators, :func:`read_numbers`) and some are not plain (junk cells such as ``?`` among
    numbers, ``1,234.5``, ``12,5``). A text column of plain numbers only (codes a file typed as text) stays text."""
    cells = _number_cells(column)
    if cells is None:
        return False
    numbers, convention, ambiguous, present = cells
    read = ~np.isnan(numbers) | ambiguous
    if (read & present).sum() < NUMERIC_SHARE * present.sum():
        return False
    return convention is not None or bool(ambiguous.any()) or bool((present & ~read).any())


def non_numbers(column) -> np.ndarray | None:
    """The mask of the cells of a text column (a pandas Series of objects or strings) that are not numbers, when the
    column holds numbers (:func:`is_number_text`: ``?``, ``n.a.``, ``12 kg`` among numbers, which pandas' readers
    leave as text); None when it does not, or when every cell is a number (with separators, :func:`read_numbers`)."""
    if not is_number_text(column):
        return None
    numbers, _, ambiguous, present = _number_cells(column)
    bad = np.isnan(numbers) & present & ~ambiguous
    return bad if bad.any() else None


class AmbiguousNumbersError(ValueError):
    """A text column of numbers whose separators read two ways (``1,234``: 1234 or 1.234); the message names the
    column and the cells."""


def read_numbers(column, name: str = "the column", where: str = "the frame",
                 rows: np.ndarray | None = None) -> tuple[np.ndarray, str | None]:
    """A text column of numbers as float64 (NaN for gaps and for cells that are no numbers) and the convention
    (:data:`CONVENTIONS`) its separators follow, None for plain numbers: ``1,234.5`` (a column with a cell
    ``x,yyy.z`` or ``x,yyy,zzz``: ',' separates thousands) or ``12,5`` / ``1.234,5`` (a column with a cell whose ','
    has other than three digits after it: ',' is the decimal point); spaces grouping digits (``1 234,5``) are
    dropped. :class:`AmbiguousNumbersError` names the column and cells that read two ways: a column whose only
    separators are ``1,234``-like, a ``1.234`` among decimal commas, or both conventions in one column (``rows``:
    the row number of each cell, else its position from 1)."""
    cells = _number_cells(column)
    if cells is None:
        import pandas as pd

        return pd.to_numeric(column, errors="coerce").to_numpy(np.float64, na_value=np.nan), None
    numbers, convention, ambiguous, _ = cells
    if ambiguous.any():
        raise AmbiguousNumbersError(
            f"column {name!r} of {where} holds numbers whose separators read two ways "
            f"({describe_cells(column, ambiguous, rows=rows)}): {CONVENTIONS['thousands']}, or "
            f"{CONVENTIONS['decimal_comma']}? Write them without thousands separators and with '.' as the decimal "
            "point")
    return numbers, convention


def describe_cells(column, mask: np.ndarray, shown: int = 5, rows: np.ndarray | None = None) -> str:
    """The first cells of ``column`` where ``mask`` holds, as ``'?' at row 5, 'x' at row 17, ...`` (``rows``: each
    cell's row number, as the file counts them; else counted from 1, in the column's order)."""
    found = np.flatnonzero(mask)
    numbers = np.arange(1, len(mask) + 1) if rows is None else np.asarray(rows)
    cells = ", ".join(f"{column.iloc[r]!r} at row {numbers[r]}" for r in found[:shown])
    return cells + (f", ... ({len(found)} in all)" if len(found) > shown else "")


#: a date whose first two numbers may both be a month (05/04/2022, 5.4.22): read one way, it is another date. The
#: served model (pipelines/tracking/serving_model.py, which imports nothing of ortflow) refuses the same cells
AMBIGUOUS_DATE = re.compile(r"^\s*(0?[1-9]|1[0-2])[/.-](0?[1-9]|1[0-2])[/.-]\d{2,4}\b")


def ambiguous_dates(column) -> np.ndarray:
    """The mask of the text cells of ``column`` that are dates whose day and month may be swapped
    (:data:`AMBIGUOUS_DATE`: ``04/03/2021``)."""
    return np.array([isinstance(v, str) and bool(AMBIGUOUS_DATE.match(v)) for v in column.tolist()], dtype=bool)


def to_days(values) -> np.ndarray:
    """int64 days since 1970-01-01 of ``values`` (datetime64, dates as ISO strings or date objects, or integers
    already counting days); missing dates (NaT, None, NaN) become :data:`MISSING_DAY`."""
    array = np.asarray(values)
    if array.dtype.kind in "iu":
        return array.astype(np.int64)
    if array.dtype.kind == "f":
        missing = np.isnan(array)
        if (array[~missing] != np.round(array[~missing])).any():
            raise ValueError("dates given as floats must be whole day counts")
        return np.where(missing, MISSING_DAY, np.nan_to_num(array)).astype(np.int64)
    if array.dtype.kind == "O":
        flat = [None if v is None or (isinstance(v, float) and v != v) else v for v in array.ravel()]
        flat = [np.datetime64("NaT", "D") if v is None else _datetime64(v) for v in flat]
        array = np.array(flat, dtype="datetime64[D]").reshape(array.shape)
    elif array.dtype.kind in "SU":
        array = array.astype("datetime64[D]")
    if array.dtype.kind != "M":
        raise TypeError(f"dates of dtype {array.dtype}: expected datetime64, date strings or day counts")
    unit, count = np.datetime_data(array.dtype)
    if unit in ("Y", "M", "W", "D"):  # whole days already (NaT stays the smallest int64)
        return array.astype("datetime64[D]").astype(np.int64)
    # ticks floored to days in integers: numpy's own datetime64[ns] -> [D] gave 1677-09-22 as +106751 (numpy 2.4)
    ticks = array.astype(np.int64)
    days = np.floor_divide(ticks, np.timedelta64(1, "D") // np.timedelta64(count, unit))
    return np.where(np.isnat(array), MISSING_DAY, days).astype(np.int64)


def _datetime64(value) -> np.datetime64:
    if hasattr(value, "to_datetime64"):  # a pandas Timestamp, time zone dropped
        value = value.tz_localize(None) if getattr(value, "tzinfo", None) is not None else value
        return value.to_datetime64()
    return np.datetime64(value, "D") if isinstance(value, str) else np.datetime64(value)


def date_parts(ops, days, parts=PARTS) -> list:
    """The requested ``parts`` of ``days`` (int64 days since 1970-01-01), computed with ``ops``: ``add``/``sub``/
    ``mul``/``div``/``mod`` of a value and an int constant or two values (``div`` of non-negative values, ``mod``
    the floor modulo with the divisor's sign) and ``is_zero`` (1 where 0, else 0). Howard Hinnant's
    ``civil_from_days`` (http://howardhinnant.github.io/date_algorithms.html)."""
    add, sub, mul, div, mod = ops.add, ops.sub, ops.mul, ops.div, ops.mod
    z = add(days, 719468)  # days since 0000-03-01
    doe = mod(z, 146097)  # day of the 400-year era, [0, 146096]
    era = div(sub(z, doe), 146097)  # exact: the floor of z / 146097
    yoe = div(sub(add(sub(doe, div(doe, 1460)), div(doe, 36524)), div(doe, 146096)), 365)  # [0, 399]
    doy = sub(doe, sub(add(mul(yoe, 365), div(yoe, 4)), div(yoe, 100)))  # day of the March-based year, [0, 365]
    mp = div(add(mul(doy, 5), 2), 153)  # March-based month, [0, 11]
    jan_feb = div(mp, 10)  # 1 for January and February (the next civil year)
    values = {}
    if {"year", "dayofyear"} & set(parts):
        values["year"] = add(add(yoe, mul(era, 400)), jan_feb)
    if "month" in parts:
        values["month"] = add(mod(add(mp, 2), 12), 1)
    if "day" in parts:
        values["day"] = add(sub(doy, div(add(mul(mp, 153), 2), 5)), 1)
    if "weekday" in parts:
        values["weekday"] = mod(add(days, 3), 7)  # 1970-01-01 was a Thursday
    if "dayofyear" in parts:
        year = values["year"]
        leap = add(sub(ops.is_zero(mod(year, 4)), ops.is_zero(mod(year, 100))), ops.is_zero(mod(year, 400)))
        # January 1st is March-based day 306; March 1st is day 60 (+1 in a leap year)
        march_on = add(add(doy, 60), leap)
        values["dayofyear"] = add(mul(jan_feb, sub(sub(doy, 305), march_on)), march_on)
    return [values[p] for p in parts]


class _NumpyOps:
    add, sub, mul, mod = staticmethod(np.add), staticmethod(np.subtract), staticmethod(np.multiply), staticmethod(np.mod)
    div = staticmethod(np.floor_divide)

    @staticmethod
    def is_zero(x):
        return (x == 0).astype(np.int64)


class DateParts(TransformerMixin, BaseEstimator):
    """Split each date column into float columns ``parts`` (any of :data:`PARTS`), column by column: the parts of
    the first column, then those of the second... A missing date gives NaN parts. Takes datetime64 columns, date
    strings or int64 day counts since 1970-01-01 (what an ONNX graph of it reads)."""

    def __init__(self, parts=PARTS):
        self.parts = parts

    def fit(self, X, y=None):
        unknown = [p for p in self.parts if p not in PARTS]
        if unknown or not self.parts:
            raise ValueError(f"DateParts(parts={self.parts!r}): each part must be one of {list(PARTS)}")
        if hasattr(X, "columns"):
            self.feature_names_in_ = np.array([str(c) for c in X.columns], dtype=object)
        self.n_features_in_ = _columns(X).shape[1]
        return self

    def transform(self, X):
        days = to_days(_columns(X))
        if days.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {days.shape[1]} date columns, DateParts was fitted on {self.n_features_in_}")
        parts = np.stack(date_parts(_NumpyOps, days, tuple(self.parts)), axis=2).astype(np.float64)
        parts[days == MISSING_DAY] = np.nan
        return parts.reshape(len(days), -1)

    def get_feature_names_out(self, input_features=None):
        names = input_features if input_features is not None else getattr(
            self, "feature_names_in_", [f"x{i}" for i in range(self.n_features_in_)])
        return np.array([f"{name}_{part}" for name in names for part in self.parts], dtype=object)


def _columns(X) -> np.ndarray:
    if hasattr(X, "columns"):  # a DataFrame: each column on its own (datetime64 columns stay datetime64)
        return np.stack([to_days(X[c].to_numpy()) for c in X.columns], axis=1) if len(X.columns) else \
            np.zeros((len(X), 0), dtype=np.int64)
    array = np.asarray(X)
    return array.reshape(-1, 1) if array.ndim == 1 else array


# -- the skl2onnx converter ------------------------------------------------------------------------------------------


class _OnnxOps:
    """``date_parts``' operations as ONNX nodes in a skl2onnx container (int64 constants as initializers: only float
    initializers are weights)."""

    def __init__(self, scope, container):
        self.scope, self.container = scope, container
        self._constants = {}

    def _value(self, x):
        if isinstance(x, str):
            return x
        if x not in self._constants:
            name = self.scope.get_unique_variable_name(f"dateparts_c{x}".replace("-", "m"))
            from onnx import TensorProto

            self.container.add_initializer(name, TensorProto.INT64, [], [int(x)])
            self._constants[x] = name
        return self._constants[x]

    def node(self, op, *inputs, **attrs):
        out = self.scope.get_unique_variable_name(f"dateparts_{op.lower()}")
        self.container.add_node(op, [self._value(i) for i in inputs], [out],
                                name=self.scope.get_unique_operator_name(f"DateParts{op}"), **attrs)
        return out

    def add(self, a, b):
        return self.node("Add", a, b)

    def sub(self, a, b):
        return self.node("Sub", a, b)

    def mul(self, a, b):
        return self.node("Mul", a, b)

    def div(self, a, b):
        return self.node("Div", a, b)

    def mod(self, a, b):
        return self.node("Mod", a, b, fmod=0)

    def is_zero(self, x):
        from onnx import TensorProto

        return self.node("Cast", self.node("Equal", x, 0), to=TensorProto.INT64)


def _shape(operator):
    from skl2onnx.common.data_types import FloatTensorType

    width = operator.inputs[0].type.shape[1] if len(operator.inputs) == 1 else len(operator.inputs)
    n_parts = len(operator.raw_operator.parts)
    operator.outputs[0].type = FloatTensorType(
        [None, width * n_parts if isinstance(width, int) else None])


def _converter(scope, operator, container):
    from onnx import TensorProto, helper

    estimator = operator.raw_operator
    ops = _OnnxOps(scope, container)
    days = operator.inputs[0].full_name
    if len(operator.inputs) > 1:
        days = ops.node("Concat", *[i.full_name for i in operator.inputs], axis=1)
    if operator.inputs[0].type.to_onnx_type().tensor_type.elem_type != TensorProto.INT64:
        days = ops.node("Cast", days, to=TensorProto.INT64)
    shape3 = ops.node("Constant", value=helper.make_tensor("s", TensorProto.INT64, [3], [0, -1, 1]))
    stacked = ops.node("Concat", *[ops.node("Reshape", p, shape3)
                                   for p in date_parts(ops, days, tuple(estimator.parts))], axis=2)
    shape2 = ops.node("Constant", value=helper.make_tensor("s", TensorProto.INT64, [2], [0, -1]))
    parts = ops.node("Cast", ops.node("Reshape", stacked, shape2), to=TensorProto.FLOAT)
    missing = ops.node("Equal", days, int(MISSING_DAY))
    repeated = ops.node("Reshape", ops.node(
        "Expand", ops.node("Reshape", missing, shape3),
        ops.node("Constant", value=helper.make_tensor("s", TensorProto.INT64, [3], [1, 1, len(estimator.parts)]))),
        shape2)
    # NaN as a Constant node, not an initializer: float initializers are the weights a trainer picks by default
    nan = ops.node("Constant", value=helper.make_tensor("nan", TensorProto.FLOAT, [], [np.nan]))
    container.add_node("Where", [repeated, nan, parts], [operator.outputs[0].full_name],
                       name=scope.get_unique_operator_name("DatePartsMissing"))


_REGISTERED = False


def register_converters() -> None:
    """Register :class:`DateParts`' converter with skl2onnx (done by :func:`ortflow.to_onnx` before it calls
    skl2onnx; call it yourself before calling skl2onnx directly)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from skl2onnx import update_registered_converter

    update_registered_converter(DateParts, "OrtflowDateParts", _shape, _converter)
    _REGISTERED = True
