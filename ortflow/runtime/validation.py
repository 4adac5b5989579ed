"""Checks shared by the trainers: data, batch size, weights to train, device. Errors name the argument."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from numbers import Integral, Real

import numpy as np
import onnx

from .._ort import cuda_help, ort
from ..exceptions import DeviceError
from ..graph.editing import FLOAT_TYPES, batch_norm_statistics


def check_array(name: str, value, ndim: Sequence[int], n_rows: int | None = None, dtype=np.float32) -> np.ndarray:
    """``value`` as a C-contiguous ``dtype`` (float) array (copied only when needed), with finite values."""
    if value is None:
        raise ValueError(f"{name} is None")
    if hasattr(value, "tocsr") or hasattr(value, "todense"):
        raise TypeError(f"{name} is a sparse {type(value).__name__}: sparse input is not supported, pass a dense "
                        "array (.toarray())")
    array = np.asarray(value)
    if array.dtype.kind == "c":
        raise ValueError(f"Complex data not supported: {name} has dtype {array.dtype}")
    if array.dtype.kind == "O":  # numbers held as objects (a pandas object column) convert
        try:
            array = array.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} has dtype object holding a value that is not a number: {exc}") from exc
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} has dtype {array.dtype}; a numeric (float) array is expected")
    if array.ndim not in ndim:
        hint = " (Reshape your data: a 1-D array is one feature, X.reshape(-1, 1), or one sample, X.reshape(1, -1))"
        raise ValueError(f"{name} has shape {array.shape}; expected {' or '.join(f'{d}-D' for d in ndim)}"
                         + (hint if array.ndim == 1 and 1 not in ndim else ""))
    if array.shape[0] == 0:
        raise ValueError(f"{name} is empty (shape {array.shape}): at least one sample is needed")
    if array.ndim == 2 and array.shape[1] == 0:
        raise ValueError(f"{name} has 0 feature(s) (shape={array.shape}) while a minimum of 1 is required.")
    if n_rows is not None and array.shape[0] != n_rows:
        raise ValueError(f"{name} has {array.shape[0]} rows but X has {n_rows}")
    array = np.ascontiguousarray(array, dtype=dtype)
    if not _all_finite(array):
        bad = np.argwhere(~np.isfinite(array))[0]
        raise ValueError(f"{name} holds NaN or infinite values (first at index {tuple(int(i) for i in bad)})")
    return array


_FINITE_BLOCK = 1 << 16  # values checked at a time: a mask of 64 KB, which the allocator hands out again


def _all_finite(array: np.ndarray) -> bool:
    """Whether every value of the contiguous ``array`` is finite, checked a block at a time: no mask as large as the
    data (a quarter of a float32 array's memory on top of it; 25-30% slower on 10^6 rows x 50 floats, its new pages
    faulted in and zeroed)."""
    flat = array.reshape(-1)
    return all(np.isfinite(flat[start:start + _FINITE_BLOCK]).all() for start in range(0, flat.size, _FINITE_BLOCK))


def check_targets(y, sample_weight, n_rows: int, label_shape: Sequence) -> tuple:
    """Validated ``(y, sample_weight)`` for ``n_rows`` samples, ``y`` shaped like the graph's label input."""
    y = check_array("y", y, ndim=(1, 2), n_rows=n_rows)
    if len(label_shape) == 2:
        width = label_shape[1] if isinstance(label_shape[1], int) and label_shape[1] > 0 else None
        y = y.reshape(len(y), -1)
        if width is not None and y.shape[1] != width:
            raise ValueError(f"y has shape {y.shape}; the model predicts {width} column(s)")
    elif y.ndim != 1:
        if y.shape[1] != 1:
            raise ValueError(f"y has shape {y.shape}; the model predicts one value per sample")
        y = y.ravel()
    if sample_weight is not None:
        sample_weight = check_array("sample_weight", sample_weight, ndim=(1, 2), n_rows=n_rows)
        if sample_weight.ndim == 2:  # a column (n, 1), as onnxcustom's examples pass it
            if sample_weight.shape[1] != 1:
                raise ValueError(f"sample_weight has shape {sample_weight.shape}; expected (n,) or (n, 1)")
            sample_weight = sample_weight.ravel()
        if (sample_weight < 0).any():
            raise ValueError("sample_weight has negative values")
        if not sample_weight.any():
            raise ValueError("sample_weight is zero everywhere: the loss and every gradient would be 0")
    return y, sample_weight


def encode_labels(y, classes: np.ndarray, width: int | None) -> np.ndarray:
    """Float targets of the log loss for class labels ``y``: the indicator of ``classes[1]`` for a binary score
    (``width`` 1 or None), one-hot rows of ``width`` columns otherwise. A label outside ``classes`` is an error."""
    labels = np.asarray(y)
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels.ravel()
    if labels.ndim != 1:
        raise ValueError(f"y has shape {labels.shape}: a classifier takes one label per sample")
    if labels.shape[0] == 0:
        raise ValueError("y is empty: at least one sample is needed")
    order = np.argsort(classes)
    ranked = classes[order]
    try:
        pos = np.clip(np.searchsorted(ranked, labels), 0, len(ranked) - 1)
        known = ranked[pos] == labels
    except (TypeError, np.exceptions.DTypePromotionError) as exc:
        raise ValueError(f"y holds labels of dtype {labels.dtype} but the graph's classes are {classes.tolist()}") from exc
    if not np.all(known):
        unknown = np.unique(labels[~known]).tolist()
        raise ValueError(f"y holds labels {unknown[:10]} that are not among the classes the graph carries "
                         f"{classes.tolist()}; convert the model from a classifier fitted on every class")
    codes = order[pos]
    k = len(classes)
    if width in (None, 1):
        if k != 2:
            raise ValueError(f"the graph's score has one column but it carries {k} classes {classes.tolist()}")
        return (codes == 1).astype(np.float32).reshape(-1, 1) if width == 1 else (codes == 1).astype(np.float32)
    if width != k:
        raise ValueError(f"the graph's score has {width} columns but it carries {k} classes {classes.tolist()}")
    return np.eye(k, dtype=np.float32)[codes]


def check_positive_int(name: str, value, upper: int | None = None, upper_name: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    if upper is not None and value > upper:
        raise ValueError(f"{name}={value} is larger than {upper_name} ({upper})")
    return int(value)


def batch_rows(batch_size, n_samples: int) -> int:
    """The rows of a batch: ``batch_size`` (checked), shrunk to ``n_samples`` with a warning when the table is
    smaller (each epoch is then one batch of every row, as scikit-learn clips its batch size)."""
    batch_size = check_positive_int("batch_size", batch_size)
    if batch_size > n_samples:
        import warnings

        warnings.warn(f"batch_size={batch_size} is larger than the {n_samples} training samples: each epoch trains "
                      f"them in one batch of {n_samples}", UserWarning, stacklevel=3)
    return min(batch_size, n_samples)


def check_positive_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive finite number")
    return float(value)


def check_finite(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not np.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number")
    return float(value)


def check_non_negative(name: str, value, why: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not np.isfinite(value) or value < 0:
        raise ValueError(f"{name}={value!r} must be a finite number >= 0" + (f": {why}" if why else ""))
    return float(value)


def check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}={value!r} must be True or False")
    return bool(value)


def check_choice(name: str, value, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {list(choices)}")
    return value


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


def check_weights_to_train(model: onnx.ModelProto, weights_to_train) -> list[str]:
    """The float initializers to train (all of them when ``weights_to_train`` is None). A name holding ``*``, ``?``
    or ``[`` is a glob pattern (``head.*`` for a fine-tuned head): it selects every float initializer it matches.

    Neither the default nor a pattern selects a BatchNormalization's running mean and variance
    (:func:`ortflow.graph.editing.batch_norm_statistics`): they are statistics of the data, which an exported network in
    eval mode keeps fixed, as torch does. Named explicitly, they are trained."""
    statistics = batch_norm_statistics(model)
    kinds = {init.name: init.data_type for init in model.graph.initializer}
    weights = {n: t for n, t in kinds.items() if n not in statistics}
    if weights_to_train is None:
        names = [n for n, t in weights.items() if t in FLOAT_TYPES]
        if not names:
            raise ValueError("the graph has no float initializer to train")
        return names
    if isinstance(weights_to_train, str):
        raise TypeError(f"weights_to_train={weights_to_train!r} must be a list of names, not a string")
    patterns = list(weights_to_train)
    if not patterns:
        raise ValueError("weights_to_train is empty")
    names, unknown = [], []
    for pattern in patterns:
        if _is_pattern(pattern):  # a pattern selects the float initializers it matches
            matched = [n for n, t in weights.items() if t in FLOAT_TYPES and fnmatch.fnmatchcase(n, pattern)]
        else:
            matched = [pattern] if pattern in kinds else []
        if not matched:
            unknown.append(pattern)
        names.extend(n for n in matched if n not in names)
    if unknown:
        raise ValueError(f"weights_to_train names unknown initializers {unknown} (nothing matches); the graph has "
                         f"{sorted(kinds)}")
    not_float = [n for n in names if kinds[n] not in FLOAT_TYPES]
    if not_float:
        types = {n: onnx.TensorProto.DataType.Name(kinds[n]) for n in not_float}
        raise ValueError(f"weights_to_train names non-float initializers {types}: only float weights can be trained")
    return names


def resolve_device(device: str) -> str:
    """``'auto'`` becomes ``'cuda'`` when this onnxruntime build has the CUDA provider, else ``'cpu'``."""
    if device == "auto":
        return "cuda" if "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"
    return device


def check_device(device: str) -> tuple[str, list[str]]:
    """(device kind 'cpu'/'cuda', onnxruntime providers) for ``device`` ('cpu', 'cuda', 'cuda:N' or 'auto')."""
    if not isinstance(device, str):
        raise DeviceError(f"device={device!r} must be a string such as 'cpu' or 'cuda'")
    device = resolve_device(device)
    kind, _, index = device.partition(":")
    if kind == "cpu" and not index:
        return "cpu", ["CPUExecutionProvider"]
    if kind == "cuda" and (not index or index.isdigit()):
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise DeviceError(f"device={device!r} but {cuda_help()}; or use device='cpu'")
        return "cuda", ["CUDAExecutionProvider", "CPUExecutionProvider"]
    raise DeviceError(f"device={device!r} is not understood; use 'cpu', 'cuda', 'cuda:N' or 'auto'")


#: the float32 precisions of matrix products on CUDA: ``'fp32'`` exact float32 (PyTorch's default), ``'tf32'``
#: TensorFloat-32 inputs (10-bit mantissa) with float32 accumulation, faster on Ampere and later
PRECISIONS = ("fp32", "tf32")


def check_precision(name: str, value) -> str:
    """``value`` if it is one of :data:`PRECISIONS`, else a ValueError naming ``name`` and the allowed values."""
    return check_choice(name, value, PRECISIONS)


def device_index(device: str) -> int:
    _, _, index = device.partition(":")
    return int(index) if index else 0
