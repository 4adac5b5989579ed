"""The reference training loop of a package (:func:`train_package`): what every other runtime (the JavaScript
library) is compared to, step for step.

Every input of a step graph is fed by its ``role`` in the manifest (the batch's ``data``, ``target`` and
``sample_weight`` rows, the state's ``weight`` and ``slot`` tensors or the flat ``state`` vector, the epoch's
``learning_rate``, the ``step`` number), every output read by its role (``loss`` or ``losses``, ``state``).
After each epoch ``on_epoch(record)`` gets ``{"epoch", "loss", "steps", "rows_seen", "learning_rate"}`` (the
JavaScript library's ``logs`` hold the same numbers). A non-finite loss at step ``s`` raises
:class:`~ortflow.exceptions.ConvergenceError` naming the epoch and the step, with ``error.state`` the state before
step ``s`` (an unrolled run that met one is replayed one step at a time from its starting state to find ``s``).
"""

from __future__ import annotations

import json
import os
from typing import Callable, Mapping

import numpy as np

from .._ort import InferenceSession
from ..exceptions import ConvergenceError, TrainingPackageError
from ..runtime.sessions import make_session_options
from ..data.shuffle import epoch_order
from ..runtime.validation import encode_labels
from .format import Manifest, Target, inputs_by_role, outputs_by_role
from .reader import TrainingPackage, TrainingState
from .state import decode_tensors


def train_package(folder: str | os.PathLike | TrainingPackage, X, y, epochs: int = 1, seed: int = 0,
                  shuffle: bool = True, sample_weight=None, state: TrainingState | None = None,
                  on_epoch: Callable[[dict], None] | None = None, flat: bool = False,
                  unrolled: bool = False) -> TrainingState:
    """Train the package's step graph with onnxruntime over (X, y), as every other runtime does: ``epochs``
    epochs from ``state`` (default the package's own); each epoch's learning rate from the schedule at the rows
    seen before it, its row order :func:`ortflow.data.shuffle.epoch_order` ``(n, seed mod 2**32, epochs completed)``
    (or the rows as given without ``shuffle``), batches of ``batch_size`` rows (the last one shorter), ``step``
    counting the updates from the state's. ``X``: an array (one data input) or a dict input name -> array (a table's
    package: its columns converted by kind, as the served model's ``table_feeds`` gives them; a number or bool
    column's gaps NaN, which the graph imputes); ``y``: targets, or class labels of a classifier. ``on_epoch(record)`` is called after each epoch (see the module's
    docstring). ``flat`` runs ``step_flat.onnx`` (the state as one vector) instead of ``step.onnx``: the same
    nodes, the same result. ``unrolled`` (implies ``flat``) runs, as the JavaScript library does, each epoch's full
    batches by the package's ``steps_<K>.onnx`` (the largest ``K`` that fits the full batches left, then the
    next...) and the rest (fewer full batches than the smallest ``K``, the short last batch) by ``step_flat.onnx``.
    Returns the new state."""
    package = folder if isinstance(folder, TrainingPackage) else TrainingPackage(folder)
    m = package.record
    current = state or package.initial_state()
    if current.package.id != package.id:
        raise TrainingPackageError(f"the state was trained from another package (package_id {current.package.id}, "
                                   f"this package's is {package.id})")
    feeds = _data_feeds(m, X)
    n = len(next(iter(feeds.values())))
    feeds[inputs_by_role(m.step, "target")[0].name] = _targets(m, y, n)
    weight = inputs_by_role(m.step, "sample_weight")
    if weight:
        w = np.ones(n, np.float32) if sample_weight is None else np.asarray(sample_weight, np.float32).reshape(-1)
        _check_finite("sample_weight", w, n)
        _check_weights(w)
        feeds[weight[0].name] = w
    elif sample_weight is not None:
        raise TrainingPackageError("sample_weight was given but the package's graph has no weight input")
    flat = flat or unrolled
    single = _Step(package, m.step_flat if flat else m.step)
    ladder = {u.steps: _Step(package, u) for u in m.unrolled} if unrolled else {}
    values = single.state_in(current.tensors)
    epochs_done, steps, rows_seen = current.epochs, current.steps, current.rows_seen
    batch = m.batch_size

    def failed(loss: float, step: int, start: int, values: dict) -> ConvergenceError:
        error = ConvergenceError(f"the training loss is {loss} at epoch {epochs_done + 1}, step {step}",
                                 epoch=epochs_done + 1, batch=start // batch + 1)
        error.state = TrainingState(package, single.state_out(values), epochs_done, step - 1, rows_seen + start,
                                    start)
        return error

    for _ in range(int(epochs)):
        rate = np.array(package.learning_rate(rows_seen), dtype=np.float32)
        order = epoch_order(n, seed, epochs_done) if shuffle else np.arange(n)
        total, start = 0.0, 0
        while True:
            count = max((k for k in ladder if k * batch <= n - start), default=0)
            if not count:
                break
            rows = order[start: start + count * batch]
            losses, after = ladder[count].run(feeds, rows, values, rate, steps + 1)
            if not np.isfinite(losses).all():  # replayed one step at a time to find the step
                for k in range(count):
                    losses_k, after_k = single.run(feeds, rows[k * batch: (k + 1) * batch], values, rate, steps + 1)
                    if not np.isfinite(losses_k[0]):
                        raise failed(float(losses_k[0]), steps + 1, start, values)
                    values, steps, start = after_k, steps + 1, start + batch
                    total += float(losses_k[0]) * batch
                continue
            values, steps, start = after, steps + count, start + count * batch
            for loss in losses:
                total += float(loss) * batch
        for start in range(start, n, batch):
            rows = order[start: start + batch]
            losses, after = single.run(feeds, rows, values, rate, steps + 1)
            loss = float(losses[0])
            if not np.isfinite(loss):
                raise failed(loss, steps + 1, start, values)
            values, steps = after, steps + 1
            total += loss * len(rows)
        rows_seen += n
        epochs_done += 1
        if on_epoch is not None:
            on_epoch({"epoch": epochs_done, "loss": total / n if n else float("nan"), "steps": steps,
                      "rows_seen": rows_seen, "learning_rate": float(rate)})
    return TrainingState(package, single.state_out(values), epochs_done, steps, rows_seen, n)


def _session(model: bytes) -> InferenceSession:
    return InferenceSession(model, make_session_options(1), providers=["CPUExecutionProvider"])


#: the key of the flat state vector among a step's state values
FLAT = "<flat state>"


class _Step:
    """One step graph of the package (``step``, ``step_flat`` or an ``unrolled`` entry): its session, its inputs
    fed by role and its outputs read by role."""

    def __init__(self, package: TrainingPackage, entry):
        self.package, self.entry = package, entry
        self.session = _session(package.read(entry.file))
        state_input = inputs_by_role(entry, "state")
        self.flat, self.state_input = bool(state_input), state_input[0].name if state_input else None
        self.batched = [s.name for s in entry.inputs if s.role in ("data", "target", "sample_weight")]
        self.rate = [s.name for s in inputs_by_role(entry, "learning_rate")]
        self.step = [s.name for s in inputs_by_role(entry, "step")]
        outputs = [s.name for s in entry.outputs]
        loss = outputs_by_role(entry, "losses") or outputs_by_role(entry, "loss")
        self.loss = outputs.index(loss[0].name)
        self.state = [outputs.index(s.name) for s in outputs_by_role(entry, "state")]

    def state_in(self, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The state inputs' values of ``tensors`` (the flat vector: the tensors one after the other)."""
        names = [t.name for t in self.package.tensors]
        if self.flat:
            return {FLAT: np.concatenate([np.asarray(tensors[k], np.float32).ravel() for k in names])
                    .astype(np.float32)}
        return {k: tensors[k] for k in names}

    def state_out(self, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.flat:
            data = values[FLAT].astype("<f4").tobytes()
            return decode_tensors(self.package.tensors, self.package.tensors, data, "the flat state")
        return dict(values)

    def run(self, feeds, rows, values, rate, step: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The losses (one, or the unrolled graph's) and the state after the step(s) on ``rows``."""
        run = {k: feeds[k][rows] for k in self.batched}
        if self.flat:
            run[self.state_input] = values[FLAT]
        else:
            run.update(values)
        run.update(dict.fromkeys(self.rate, rate))
        run.update(dict.fromkeys(self.step, np.array(step, dtype=np.float32)))
        out = self.session.run(None, run)
        state = [out[i] for i in self.state]
        after = ({FLAT: state[0]} if self.flat else
                 dict(zip([t.name for t in self.package.tensors], state)))
        return np.atleast_1d(out[self.loss]), after


def _check_weights(w: np.ndarray) -> None:
    """Sample weights as the trainers take them (and the JavaScript library): none negative, not all zero."""
    negative = np.flatnonzero(w < 0)
    if negative.size:
        row = int(negative[0])
        raise TrainingPackageError(f"sample_weight has negative values (row {row}: {w[row]:g}): a negative weight "
                                   "pushes the model away from its rows")
    if not w.any():
        raise TrainingPackageError("sample_weight is zero everywhere: the loss and every gradient would be 0")


def _check_finite(what: str, array: np.ndarray, n: int, columns: list[str] | None = None,
                  gaps: bool = False) -> None:
    """``array`` has ``n`` rows and, if floats, no NaN or infinity (``gaps``: NaN allowed, a table column's gap)."""
    if len(array) != n:
        raise TrainingPackageError(f"{what} has {len(array)} rows, X has {n}")
    bad = (np.isinf(array) if gaps else ~np.isfinite(array)) if array.dtype.kind == "f" else None
    if bad is not None and bad.any():
        where = tuple(np.argwhere(bad)[0].tolist())
        value = float(array[where])
        spelled = "NaN" if np.isnan(value) else "Infinity" if value > 0 else "-Infinity"  # JavaScript's spelling
        raise TrainingPackageError(f"{what} holds a non-finite value ({spelled}) at {_cell(where, columns)}")


def _numbers(what: str, values, dtype, columns: list[str] | None = None) -> np.ndarray:
    """``values`` as an array of ``dtype``; an empty or non-numeric cell refused naming its row and column."""
    try:
        return np.asarray(values, dtype=dtype)
    except (TypeError, ValueError) as exc:
        try:
            cells = np.asarray(values, dtype=object)
        except ValueError:
            raise TrainingPackageError(f"{what}: {exc}") from exc
        if cells.dtype != object or not cells.ndim:
            raise TrainingPackageError(f"{what}: {exc}") from exc
        for index in np.ndindex(cells.shape):
            cell = cells[index]
            try:
                np.asarray(cell, dtype=dtype)
            except (TypeError, ValueError):
                blank = cell is None or (isinstance(cell, str) and not cell.strip())
                found = "an empty cell" if blank else f"{json.dumps(str(cell))}, not a number,"
                raise TrainingPackageError(f"{what} holds {found} at {_cell(index, columns)}") from exc
        raise TrainingPackageError(f"{what}: {exc}") from exc


def _cell(index: tuple, columns: list[str] | None) -> str:
    """``row r, column c ('name')`` of an array index (rows and columns from 0, as the JavaScript library's)."""
    where = f"row {index[0]}" if index else "the value"
    if len(index) == 2:
        name = f" ({columns[index[1]]!r})" if columns and index[1] < len(columns) else ""
        where += f", column {index[1]}{name}"
    elif len(index) > 2:
        where += f", index {list(index[1:])}"
    return where


def _data_feeds(m: Manifest, X) -> dict[str, np.ndarray]:
    """The data inputs' values of X; a table's number and bool columns (``preprocess.columns``) may hold NaN, a gap
    their graph imputes."""
    inputs = inputs_by_role(m.step, "data")
    gaps = {name for name, kind in (m.preprocess.columns or {}).items() if kind in ("number", "bool")}
    given = X if isinstance(X, Mapping) else {inputs[0].name: X} if len(inputs) == 1 else None
    if given is None or set(given) != {i.name for i in inputs}:
        raise TrainingPackageError(f"X must give the inputs {[i.name for i in inputs]}")
    feeds, n = {}, None
    for spec in inputs:
        columns = m.feature_names if len(inputs) == 1 else None
        array = (np.asarray(given[spec.name], dtype=object) if spec.dtype == "string" else
                 _numbers(f"X ({spec.name!r})", given[spec.name], np.dtype(spec.dtype), columns))
        shape = spec.shape
        if shape and len(shape) != array.ndim or any(isinstance(d, int) and d != a for d, a in
                                                      zip((shape or [])[1:], array.shape[1:])):
            raise TrainingPackageError(f"input {spec.name!r} has shape {array.shape}; the package takes {shape}")
        n = len(array) if n is None else n
        _check_finite(f"X ({spec.name!r})", array, n, columns, gaps=spec.name in gaps)
        feeds[spec.name] = array
    return feeds


def _targets(m: Manifest | dict, y, n: int) -> np.ndarray:
    """The target input's values for the labels or values ``y`` (``m``: the manifest, as a record or as JSON)."""
    target = m.target if isinstance(m, Manifest) else Target.from_json(m["target"], "target")
    if target.encoding != "value":
        width = target.shape[1] if len(target.shape) == 2 else None
        classes = np.asarray(target.classes, dtype=object if isinstance(target.classes[0], str) else None)
        try:
            encoded = encode_labels(y, classes, width if isinstance(width, int) else None)
        except ValueError as exc:
            raise TrainingPackageError(f"y: {exc}") from exc
        if width == 1:
            encoded = encoded.reshape(-1, 1)
        _check_finite("y", encoded, n)
        return encoded
    array = _numbers("y", y, np.float32)
    if len(target.shape) == 2:
        array = array.reshape(len(array), -1)
    elif array.ndim == 2 and array.shape[1] == 1:
        array = array.ravel()
    _check_finite("y", array, n)
    return array


__all__ = ["train_package"]
