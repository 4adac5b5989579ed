"""How a user's ``X`` becomes the feeds of a graph's data inputs (every input but the label and the weight).

``X`` may be

- an array (anything ``np.asarray`` takes): the graph has one data input, and the array is cast to that input's
  element type and checked against its declared shape (rank and fixed dimensions): a float matrix for a converted
  scikit-learn model, ``(n, 1, 8, 8)`` images or ``(n, T)`` int64 tokens for a graph exported from PyTorch;
- a pandas DataFrame: with one two-dimensional input, the frame's columns are its features, in order; with several
  inputs (a scikit-learn ``ColumnTransformer`` converted with one input per column), each input is fed the column of
  its name, whatever the frame's column order;
- a dict name -> array: each input fed by name.

The column names a frame brings are the estimator's ``feature_names_in_``; later frames must hold the same columns
(any order when each column is its own input, the same order when the columns form one matrix).

Values: a float input takes finite values, and NaN too where the graph imputes gaps (it holds an ``Imputer``
node); an integer input takes integers (integral floats included), and dates (``datetime64``) as days since
1970-01-01 (:func:`ortflow.convert.tables.to_days`; a missing date only where the graph imputes); a text input takes
strings, no gaps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto

from ..runtime.validation import check_array

_INTEGER = {TensorProto.INT64: np.int64, TensorProto.INT32: np.int32, TensorProto.INT8: np.int8,
            TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16, TensorProto.UINT16: np.uint16,
            TensorProto.UINT32: np.uint32, TensorProto.UINT64: np.uint64}
_FLOAT = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64}


@dataclass(frozen=True)
class DataInput:
    """A graph input fed from ``X``: its name, element type and declared dimensions after the batch axis (an int
    where fixed, None or a symbolic name where not)."""

    name: str
    elem_type: int
    dims: tuple

    @property
    def type_name(self) -> str:
        return TensorProto.DataType.Name(self.elem_type).lower()


class InputMapping:
    """The data inputs of a graph and the conversion of ``X`` into their feeds."""

    def __init__(self, inputs: list[DataInput], allow_missing: bool = False,
                 categories: dict[str, set] | None = None):
        if not inputs:
            raise ValueError("the graph has no data input (every input is the label or the weight)")
        self.inputs = list(inputs)
        self.allow_missing = allow_missing
        self.categories = categories or {}  # text input -> the only values its one-hot encoder accepts

    @classmethod
    def of(cls, model: onnx.ModelProto, exclude=()) -> InputMapping:
        """The inputs of ``model`` that are neither initializers nor in ``exclude`` (label, weight)."""
        inits = {i.name for i in model.graph.initializer}
        inputs = []
        for value in model.graph.input:
            if value.name in inits or value.name in exclude:
                continue
            tensor = value.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                         for d in tensor.shape.dim)[1:]
            inputs.append(DataInput(value.name, tensor.elem_type, dims))
        imputes = any(node.op_type == "Imputer" for node in model.graph.node)
        return cls(inputs, allow_missing=imputes, categories=_strict_categories(model))

    @property
    def names(self) -> list[str]:
        return [i.name for i in self.inputs]

    @property
    def n_features(self) -> int | None:
        """The fixed width of a single matrix input (None otherwise)."""
        if len(self.inputs) == 1 and len(self.inputs[0].dims) == 1 and isinstance(self.inputs[0].dims[0], int) \
                and self.inputs[0].dims[0] > 0:
            return self.inputs[0].dims[0]
        return None

    @property
    def is_table(self) -> bool:
        """Several inputs fed by column name (a converted ``ColumnTransformer``)."""
        return len(self.inputs) > 1

    def feeds(self, X, n_features: int | None = None, feature_names: list[str] | None = None
              ) -> tuple[dict[str, np.ndarray], list[str] | None]:
        """``(feeds, column names)`` for ``X``: one array per input, all with the same number of rows.

        ``n_features``: the width a single matrix input had at fit (the graph may leave it symbolic);
        ``feature_names``: the columns seen at fit, which a frame must hold again.
        """
        if hasattr(X, "tocsr") or hasattr(X, "todense"):
            raise TypeError(f"X is a sparse {type(X).__name__}: sparse input is not supported, pass a dense array "
                            "(.toarray())")
        names = _column_names(X)
        if feature_names is not None and names is not None:
            _check_same_columns(names, feature_names, ordered=not self.is_table)
        if _is_table_like(X) and (self.is_table or isinstance(X, Mapping)):
            columns = _columns(X)
            missing = [i.name for i in self.inputs if i.name not in columns]
            extra = [c for c in columns if c not in self.names]
            if missing or extra:
                raise ValueError(
                    f"X's columns do not match the graph's inputs: missing {missing}, unexpected {extra} "
                    f"(the graph's inputs: {self.names})")
            feeds = {i.name: self._convert(i, columns[i.name], f"column {i.name!r}") for i in self.inputs}
        else:
            if self.is_table:
                raise TypeError(
                    f"the graph has {len(self.inputs)} inputs {self.names}: pass a pandas DataFrame or a dict "
                    "with one column per input, not a single array")
            single = self.inputs[0]
            value = X.to_numpy() if hasattr(X, "to_numpy") and not isinstance(X, np.ndarray) else X
            feeds = {single.name: self._convert(single, value, "X")}
            width = feeds[single.name].shape[1] if feeds[single.name].ndim == 2 else None
            if n_features is not None and width is not None and width != n_features:
                raise ValueError(f"X has {width} features but the model expects {n_features}")
        rows = {name: len(a) for name, a in feeds.items()}
        if len(set(rows.values())) > 1:
            raise ValueError(f"the inputs have different numbers of rows: {rows}")
        return feeds, names

    def _convert(self, spec: DataInput, value, what: str) -> np.ndarray:
        rank = len(spec.dims) + 1
        if hasattr(value, "to_numpy") and not isinstance(value, np.ndarray):
            value = value.to_numpy()
        if spec.elem_type in _FLOAT:
            array = _float_array(what, value, rank, self.allow_missing, _FLOAT[spec.elem_type])
        elif spec.elem_type in _INTEGER:
            array = _integer_array(what, value, _INTEGER[spec.elem_type], self.allow_missing)
        elif spec.elem_type == TensorProto.STRING:
            array = _string_array(what, value)
            known = self.categories.get(spec.name)
            if known is not None:
                unknown = sorted(set(array.ravel().tolist()) - known)
                if unknown:
                    raise ValueError(f"{what} holds {len(unknown)} value(s) its one-hot encoder did not see in "
                                     f"training, {unknown[:5]}: the graph cannot encode them (refit the encoder "
                                     "with handle_unknown='ignore' to encode them as zeros)")
        elif spec.elem_type == TensorProto.BOOL:
            array = np.asarray(value).astype(bool)
        else:
            raise TypeError(f"input {spec.name!r} has type {spec.type_name}, which ortflow does not feed")
        if array.ndim == rank - 1 and rank == 2 and spec.dims[0] in (1, None) and (self.is_table or what != "X"):
            array = array.reshape(-1, 1)  # a column fed to an (n, 1) input
        if array.ndim != rank:
            raise ValueError(f"{what} has shape {array.shape}; input {spec.name!r} expects rank {rank} "
                             f"(shape {['n', *spec.dims]})")
        if array.shape[0] == 0:
            raise ValueError(f"{what} is empty (shape {array.shape}): at least one sample is needed")
        fixed = [(k, d) for k, d in enumerate(spec.dims, 1) if isinstance(d, int) and d > 0]
        wrong = [(k, d) for k, d in fixed if array.shape[k] != d]
        if wrong:
            if rank == 2:
                raise ValueError(f"{what} has {array.shape[1]} features but the model expects {spec.dims[0]}")
            raise ValueError(f"{what} has shape {array.shape}; input {spec.name!r} expects {['n', *spec.dims]}")
        return array


#: ops a column goes through unchanged on its way to an encoder (skl2onnx picks a table's columns with Gather)
_PASSING = frozenset({"Identity", "Gather", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Cast"})


def _strict_categories(model: onnx.ModelProto) -> dict[str, set]:
    """For each text input read by a one-hot encoder that fails on unknown values (``ai.onnx.ml`` OneHotEncoder,
    ``zeros=0``), the categories it knows: ortflow names the column and the values instead of onnxruntime's
    'Unknown Category'."""
    producer = {o: n for n in model.graph.node for o in n.output}
    inputs = {i.name for i in model.graph.input}
    found: dict[str, set] = {}
    for node in model.graph.node:
        if node.op_type != "OneHotEncoder":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("zeros", 1) != 0 or "cats_strings" not in attrs:
            continue
        name = node.input[0]
        while name not in inputs and name in producer and producer[name].op_type in _PASSING:
            name = producer[name].input[0]
        if name in inputs:
            cats = {c.decode() if isinstance(c, bytes) else str(c) for c in attrs["cats_strings"]}
            found[name] = found[name] | cats if name in found else cats
    return found


def _is_table_like(X) -> bool:
    return isinstance(X, Mapping) or (hasattr(X, "columns") and hasattr(X, "to_numpy"))


def _columns(X) -> dict:
    if isinstance(X, Mapping):
        return dict(X)
    return {str(c): X[c] for c in X.columns}


def _column_names(X) -> list[str] | None:
    """The column names of a frame or dict whose names are all strings (scikit-learn's rule), else None."""
    if isinstance(X, Mapping):
        names = list(X)
    elif hasattr(X, "columns") and hasattr(X, "to_numpy"):
        names = list(X.columns)
    else:
        return None
    return [str(n) for n in names] if names and all(isinstance(n, str) for n in names) else None


def _check_same_columns(names: list[str], fitted: list[str], ordered: bool) -> None:
    if names == fitted or (not ordered and sorted(names) == sorted(fitted)):
        return
    missing = [n for n in fitted if n not in names]
    unexpected = [n for n in names if n not in fitted]
    if missing or unexpected:
        raise ValueError(f"X's columns differ from those seen at fit: missing {missing}, unexpected {unexpected}")
    raise ValueError(f"X's columns are in another order than at fit: {names} against {fitted}")


def _float_array(what: str, value, rank: int, allow_missing: bool, dtype) -> np.ndarray:
    if not allow_missing:
        return check_array(what, value, ndim=(rank,) if what == "X" else (rank - 1, rank), dtype=dtype)
    array = np.asarray(value)
    if array.dtype.kind == "O":
        array = np.array([np.nan if v is None else v for v in array.ravel()], dtype=np.float64).reshape(array.shape)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{what} has dtype {array.dtype}; a numeric column is expected")
    array = np.ascontiguousarray(array, dtype=dtype)
    if np.isinf(array).any():
        bad = np.argwhere(np.isinf(array))[0]
        raise ValueError(f"{what} holds infinite values (first at index {tuple(int(i) for i in bad)})")
    return array


def _integer_array(what: str, value, dtype, allow_missing: bool = False) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind == "M":  # dates: days since 1970-01-01, as ortflow.convert.tables.DateParts reads them
        from ..convert.tables import MISSING_DAY, to_days

        days = to_days(array)
        if not allow_missing and (days == MISSING_DAY).any():
            index = tuple(int(i) for i in np.argwhere(days == MISSING_DAY)[0])
            raise ValueError(f"{what} has a missing date at index {index}: fill it, or impute the date parts in "
                             "the model")
        return np.ascontiguousarray(days, dtype=dtype)
    if array.dtype.kind == "b":
        return array.astype(dtype)
    if array.dtype.kind in "iu":
        return np.ascontiguousarray(array, dtype=dtype)
    try:
        floats = array.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} holds values that are not integers ({exc}); a date column is fed as dates "
                        "(datetime64): parse text first, e.g. pandas.to_datetime(frame[column], format=...)") from exc
    bad = ~np.isfinite(floats) | (floats != np.round(floats))
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{what} holds {floats[index]!r} at index {index}: the graph takes integers here")
    return np.ascontiguousarray(floats, dtype=dtype)


def _string_array(what: str, value) -> np.ndarray:
    array = np.asarray(value, dtype=object)
    missing = np.array([v is None or (isinstance(v, float) and v != v) for v in array.ravel()]).reshape(array.shape)
    if missing.any():
        index = tuple(int(i) for i in np.argwhere(missing)[0])
        raise ValueError(f"{what} has a missing value at index {index}: the graph takes text here; fill the gaps "
                         "(for example frame[column].fillna('missing')) or impute them in the model")
    return np.array([str(v) for v in array.ravel()], dtype=object).reshape(array.shape)
