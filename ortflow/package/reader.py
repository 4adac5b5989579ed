"""Training packages: what a runtime without Python needs to train an ortflow model (docs/TRAINING_OUTSIDE_PYTHON.md).

A package is a folder:

- ``step.onnx``: ortflow's full-training step (:func:`ortflow.autodiff.training_step`, symbolic batch axis ``batch``:
  one graph for every batch size, the last short batch included). Inputs: the batch (data inputs, target, sample
  weight when the graph has one), the trained weights, the optimizer's slots ``<weight>_<slot>``, ``learning_rate``
  and, for the rules that read it, ``step`` (float32 scalars); outputs: the loss, then ``<name>_updated`` for every
  state tensor in input order.
- ``step_flat.onnx``: the same step with the whole state as one float32 vector ``state`` in and ``state_updated``
  out (``state.bin``'s layout): two state tensors cross the runtime's API per step instead of twice their number.
- ``steps_<K>.onnx`` (optional, the manifest's ``unrolled`` list, K = 2, 4, ... up to a bound chosen from the step's
  cost): ``K`` consecutive flat steps unrolled in one graph, for runtimes whose every run costs more than a small
  step (onnxruntime-node: 70-120 µs). Inputs: ``K * batch_size`` rows of each batched input (``K`` full batches one
  after the other), ``state``, the epoch's ``learning_rate`` and ``step`` (the first step's number, the copies
  count on from it); outputs: ``losses`` (``K``) and ``state_updated``. Each copy runs the same nodes on its rows:
  the state after them is the one ``K`` single steps reach.
- ``predict.onnx``: the prediction graph, trained weights as float32 initializers in ``raw_data``; the manifest
  gives the byte range of each weight's values in the file, so another runtime writes trained weights into a copy
  of these bytes (same length) and has the trained graph, with no protobuf library.
- ``loss.onnx``: the graph with its loss output (what a Python trainer continues from, :meth:`TrainingState.estimator`).
- ``state.bin``: the state tensors (weights then optimizer slots), float32 little-endian, one after the other at the
  manifest's byte offsets.
- ``manifest.json``: format and version, every tensor (shape, dtype), optimizer, schedule, batch size, loss, classes,
  feature names, the shuffle generator (:mod:`ortflow.shuffle`), the SHA-256 of every file.

A state trained elsewhere comes back as a *state file* (:meth:`TrainingState.to_bytes`): ``b"OFTS"``, a uint32
little-endian header length ``H``, ``H`` bytes of UTF-8 JSON (format, version, the package's id, the tensor table,
``epochs``, ``steps``, ``rows_seen``, ``rows``; padded with spaces to a multiple of 4 bytes), then the float32 data
laid out as the header's table says (the package's state layout). :func:`load_training_state` reads it,
:func:`train_package` is the reference training loop every other runtime is compared to. Writing a package:
:func:`ortflow.package_export.export_training_package` (``ortflow.export_training_package``).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from .. import graph as g
from .._ort import MAX_IR_VERSION, InferenceSession
from ..exceptions import ConvergenceError, TrainingPackageError
from ..learning_rates import LEARNING_RATE, STEP
from ..registry import family
from ..runtime import make_session_options
from ..schedules import learning_rate_at
from ..shuffle import epoch_order
from ..validation import encode_labels

FORMAT = "ortflow-training-package"
FORMAT_VERSION = 1
STATE_FORMAT = "ortflow-training-state"
STATE_MAGIC = b"OFTS"
MANIFEST = "manifest.json"
STEP_FILE, PREDICT_FILE, LOSS_FILE, STATE_FILE = "step.onnx", "predict.onnx", "loss.onnx", "state.bin"
FLAT_STEP_FILE = "step_flat.onnx"
#: the flat step graph's whole state, in and out (the state tensors one after the other, ``state.bin``'s layout)
FLAT_STATE, FLAT_UPDATED = "state", "state_updated"
#: the unrolled step graphs' file name (``K`` steps) and their output of the ``K`` losses
UNROLLED_FILE, UNROLLED_LOSSES = "steps_{}.onnx", "losses"
#: the IR version of the package's graphs: onnxruntime 1.19 (the training build) to 1.32 read it
IR_VERSION = MAX_IR_VERSION


# --- reading --------------------------------------------------------------------------------------------------
class TrainingPackage:
    """A package folder, its manifest read and every file's checksum verified (:class:`TrainingPackageError`
    naming the file otherwise)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        path = self.folder / MANIFEST
        if not path.is_file():
            raise TrainingPackageError(f"{str(self.folder)!r} is not a training package: it has no {MANIFEST}")
        try:
            manifest = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise TrainingPackageError(f"{str(path)!r} is not readable JSON: {exc}") from exc
        found = manifest.get("format") if isinstance(manifest, dict) else None
        if found != FORMAT:
            raise TrainingPackageError(f"{str(path)!r} has format {found!r}, not {FORMAT!r}")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise TrainingPackageError(f"{str(path)!r} has format_version {manifest.get('format_version')!r}; this "
                                       f"ortflow reads version {FORMAT_VERSION}")
        self.manifest = manifest
        self._files: dict[str, bytes] = {}
        for name, entry in manifest.get("files", {}).items():
            file = g.safe_join(self.folder, name)
            if not file.is_file():
                raise TrainingPackageError(f"the package {str(self.folder)!r} lacks its file {name!r}")
            data = file.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            if digest != entry.get("sha256"):
                raise TrainingPackageError(f"{name!r} of the package {str(self.folder)!r} does not match its "
                                           f"checksum (sha256 {digest}, the manifest says {entry.get('sha256')}): "
                                           "the file was changed or damaged")
            self._files[name] = data
        for name in (STEP_FILE, FLAT_STEP_FILE, PREDICT_FILE, LOSS_FILE, STATE_FILE):
            if name not in self._files:
                raise TrainingPackageError(f"the manifest of {str(self.folder)!r} lists no {name!r}")

    def read(self, name: str) -> bytes:
        """The verified bytes of the package's file ``name``."""
        return self._files[name]

    @property
    def id(self) -> str:
        return self.manifest["package_id"]

    @property
    def tensors(self) -> list[dict]:
        """The state table: ``{name, shape, dtype, offset (bytes), length (values)}`` per tensor."""
        return self.manifest["state"]["tensors"]

    @property
    def weights(self) -> list[str]:
        return self.manifest["state"]["weights"]

    def initial_state(self) -> TrainingState:
        """The state the package starts from (``state.bin`` and the manifest's ``progress``)."""
        progress = self.manifest["progress"]
        tensors = _unpack(self, self.read(STATE_FILE), self.tensors, STATE_FILE)
        return TrainingState(self, tensors, int(progress["epochs"]), int(progress["steps"]),
                             int(progress["rows_seen"]), 0)

    def learning_rate(self, rows_seen: int) -> float:
        """The schedule's rate for an epoch starting after ``rows_seen`` rows (what every runtime feeds, cast to
        float32)."""
        s = self.manifest["schedule"]
        return learning_rate_at(s["name"], s["eta0"], int(rows_seen), s["power_t"], s["alpha"])


def _unpack(package: TrainingPackage, data: bytes, table: list[dict], what: str) -> dict[str, np.ndarray]:
    expected = {t["name"]: tuple(t["shape"]) for t in package.tensors}
    given = {t.get("name"): tuple(t.get("shape") or ()) for t in table}
    if given != expected:
        missing = sorted(set(expected) - set(given))
        extra = sorted(set(given) - set(expected))
        shapes = sorted(f"{n}: {given[n]} instead of {expected[n]}" for n in set(given) & set(expected)
                        if given[n] != expected[n])
        raise TrainingPackageError(f"{what} does not hold the package's state: missing {missing}, unknown {extra}, "
                                   f"other shapes {shapes}")
    out = {}
    for t in table:
        start, count = int(t["offset"]), int(np.prod(t["shape"], dtype=np.int64))
        if start < 0 or start % 4 or start + 4 * count > len(data):
            raise TrainingPackageError(f"{what}: tensor {t['name']!r} lies outside the data ({start} + {4 * count} "
                                       f"bytes of {len(data)})")
        array = np.frombuffer(data, dtype="<f4", count=count, offset=start).astype(np.float32).reshape(t["shape"])
        if not np.isfinite(array).all():
            bad = int(np.size(array) - np.isfinite(array).sum())
            raise TrainingPackageError(f"{what}: tensor {t['name']!r} holds {bad} non-finite value(s)")
        out[t["name"]] = array
    return {t["name"]: out[t["name"]] for t in package.tensors}


@dataclass
class TrainingState:
    """A package's state: every state tensor (weights, then optimizer slots) and the progress that goes with it:
    ``epochs`` completed, optimizer ``steps``, ``rows_seen`` (all epochs), ``rows`` (the rows of the data of the
    last training, the weight of this state in :func:`average_states`)."""

    package: TrainingPackage
    tensors: dict[str, np.ndarray]
    epochs: int = 0
    steps: int = 0
    rows_seen: int = 0
    rows: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def weights(self) -> dict[str, np.ndarray]:
        """The trained weights (no optimizer slot)."""
        return {name: self.tensors[name] for name in self.package.weights}

    def get_trained_onnx(self) -> onnx.ModelProto:
        """The prediction graph with these weights inside, what any ONNX runtime runs."""
        return onnx.load_from_string(self.trained_onnx_bytes())

    def trained_onnx_bytes(self) -> bytes:
        """``predict.onnx`` with these weights written at the manifest's byte ranges (what the JavaScript library's
        ``exportModel()`` does)."""
        data = bytearray(self.package.read(PREDICT_FILE))
        for patch in self.package.manifest["predict"]["weights"]:
            values = np.ascontiguousarray(self.tensors[patch["name"]], dtype="<f4").tobytes()
            data[patch["offset"]: patch["offset"] + patch["bytes"]] = values
        return bytes(data)

    def to_bytes(self) -> bytes:
        """The state file (see the module's docstring)."""
        table, offset, chunks = [], 0, []
        for t in self.package.tensors:
            array = np.ascontiguousarray(self.tensors[t["name"]], dtype="<f4")
            table.append({"name": t["name"], "shape": list(array.shape), "offset": offset, "length": int(array.size)})
            chunks.append(array.tobytes())
            offset += array.nbytes
        header = json.dumps({"format": STATE_FORMAT, "format_version": FORMAT_VERSION, "package_id": self.package.id,
                             "tensors": table, "epochs": self.epochs, "steps": self.steps,
                             "rows_seen": self.rows_seen, "rows": self.rows, **self.extra}).encode()
        header += b" " * (-len(header) % 4)
        return STATE_MAGIC + struct.pack("<I", len(header)) + header + b"".join(chunks)

    def estimator(self, **params):
        """An unfitted :class:`ortflow.OrtGradientOptimizer` of the package's loss graph holding these weights, its
        optimizer, schedule and batch size (``params`` overrides or adds settings: ``max_iter``...). Its ``fit``
        starts new optimizer slots (Adam's moments at zero, ``step`` from 1); the weights continue from here."""
        from ..full import OrtGradientOptimizer

        m = self.package.manifest
        loss_model = g.replace_initializers(onnx.load_from_string(self.package.read(LOSS_FILE)), self.weights)
        optimizer = m["optimizer"]
        rate = family("optimizer")[optimizer["name"]](**optimizer["params"])
        settings = dict(learning_rate=rate, batch_size=m["batch_size"], loss_output_name=m["loss"]["output"],
                        label_name=m["loss_model"]["label"], weights_to_train=list(self.package.weights))
        if m["loss_model"]["weight"]:
            settings["sample_weight_name"] = m["loss_model"]["weight"]
        settings.update(params)
        return OrtGradientOptimizer(loss_model, **settings)


def load_training_state(folder: str | os.PathLike | TrainingPackage, state: bytes | str | os.PathLike) -> TrainingState:
    """The state file ``state`` (bytes or a path; :meth:`TrainingState.to_bytes`, the JavaScript library's
    ``exportState()``) of the package in ``folder``, checked: its format, that it comes from this package, its
    tensors' names and shapes, finite values. ``.get_trained_onnx()`` is the trained prediction graph,
    ``.estimator()`` a trainer that goes on training. Nothing is written."""
    package = folder if isinstance(folder, TrainingPackage) else TrainingPackage(folder)
    what = "the state"
    if not isinstance(state, (bytes, bytearray, memoryview)):
        what = f"the state {str(state)!r}"
        state = Path(state).read_bytes()
    data = bytes(state)
    if len(data) < 8 or data[:4] != STATE_MAGIC:
        raise TrainingPackageError(f"{what} is not an ortflow training state (it does not start with {STATE_MAGIC!r})")
    (length,) = struct.unpack("<I", data[4:8])
    try:
        header = json.loads(data[8: 8 + length].decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise TrainingPackageError(f"{what} has an unreadable header: {exc}") from exc
    if header.get("format") != STATE_FORMAT or header.get("format_version") != FORMAT_VERSION:
        raise TrainingPackageError(f"{what} has format {header.get('format')!r} version "
                                   f"{header.get('format_version')!r}; this ortflow reads {STATE_FORMAT!r} version "
                                   f"{FORMAT_VERSION}")
    if header.get("package_id") != package.id:
        raise TrainingPackageError(f"{what} was trained from another package (package_id {header.get('package_id')!r}, "
                                   f"this package's is {package.id!r})")
    tensors = _unpack(package, data[8 + length:], header.get("tensors") or [], what)
    progress = {}
    for key in ("epochs", "steps", "rows_seen", "rows"):
        value = header.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TrainingPackageError(f"{what}: {key}={value!r} is not a count")
        progress[key] = value
    extra = {k: v for k, v in header.items() if k not in ("format", "format_version", "package_id", "tensors",
                                                          *progress)}
    return TrainingState(package, tensors, extra=extra, **progress)


def average_states(states: Sequence[TrainingState]) -> TrainingState:
    """The mean of states of one package weighted by their ``rows`` (federated averaging), every tensor averaged;
    ``epochs`` and ``steps`` the largest, ``rows_seen`` and ``rows`` summed."""
    if not states:
        raise TrainingPackageError("average_states needs at least one state")
    package = states[0].package
    if any(s.package.id != package.id for s in states):
        raise TrainingPackageError("average_states: the states come from different packages")
    rows = np.array([s.rows for s in states], dtype=np.float64)
    if (rows <= 0).any():
        raise TrainingPackageError(f"average_states: every state needs rows > 0 to be weighted, got {rows.tolist()}")
    share = rows / rows.sum()
    tensors = {name: sum(float(p) * s.tensors[name].astype(np.float64) for p, s in zip(share, states))
               .astype(np.float32) for name in states[0].tensors}
    return TrainingState(package, tensors, max(s.epochs for s in states), max(s.steps for s in states),
                         sum(s.rows_seen for s in states), int(rows.sum()))


# --- the reference loop ---------------------------------------------------------------------------------------
def train_package(folder: str | os.PathLike | TrainingPackage, X, y, epochs: int = 1, seed: int = 0,
                  shuffle: bool = True, sample_weight=None, state: TrainingState | None = None,
                  on_epoch: Callable[[int, float], None] | None = None, flat: bool = False,
                  unrolled: bool = False) -> TrainingState:
    """Train the package's step graph with onnxruntime over (X, y), as every other runtime does: ``epochs``
    epochs from ``state`` (default the package's own); each epoch's learning rate from the schedule at the rows
    seen before it, its row order :func:`ortflow.shuffle.epoch_order` ``(n, seed mod 2**32, epochs completed)``
    (or the rows as given without ``shuffle``), batches of ``batch_size`` rows (the last one shorter), ``step``
    counting the updates from the state's. ``X``: an array (one data input) or a dict input name -> array; ``y``:
    targets, or class labels of a classifier. ``on_epoch(epoch, mean loss)`` is called after each epoch. ``flat``
    runs ``step_flat.onnx`` (the state as one vector) instead of ``step.onnx``: the same nodes, the same result.
    ``unrolled`` (implies ``flat``) runs, as the JavaScript library does, each epoch's full batches by the package's
    ``steps_<K>.onnx`` (the largest ``K`` that fits the full batches left, then the next...) and the rest (fewer
    full batches than the smallest ``K``, the short last batch) by ``step_flat.onnx``. Returns the new state."""
    package = folder if isinstance(folder, TrainingPackage) else TrainingPackage(folder)
    m = package.manifest
    current = state or package.initial_state()
    if current.package.id != package.id:
        raise TrainingPackageError(f"the state was trained from another package (package_id {current.package.id}, "
                                   f"this package's is {package.id})")
    feeds = _data_feeds(m, X)
    n = len(next(iter(feeds.values())))
    feeds[m["target"]["name"]] = _targets(m, y, n)
    if m["sample_weight"]:
        w = np.ones(n, np.float32) if sample_weight is None else np.asarray(sample_weight, np.float32).reshape(-1)
        _check_finite("sample_weight", w, n)
        feeds[m["sample_weight"]] = w
    elif sample_weight is not None:
        raise TrainingPackageError("sample_weight was given but the package's graph has no weight input")
    flat = flat or unrolled
    session = _session(package.read(FLAT_STEP_FILE if flat else STEP_FILE))
    ladder = Unrolled(package) if unrolled else None
    names = [t["name"] for t in package.tensors]
    values = dict(current.tensors)
    if flat:  # the whole state in one vector, each step's output fed back as it is
        values = {FLAT_STATE: np.concatenate([values[n].ravel() for n in names]).astype(np.float32)}
    epochs_done, steps, rows_seen = current.epochs, current.steps, current.rows_seen
    batch = int(m["batch_size"])
    reads_step = m["optimizer"]["reads_step"]
    for _ in range(int(epochs)):
        rate = np.array(package.learning_rate(rows_seen), dtype=np.float32)
        order = epoch_order(n, seed, epochs_done) if shuffle else np.arange(n)
        total = 0.0
        start = 0
        while ladder is not None and ladder.count(n - start, batch):
            count = ladder.count(n - start, batch)
            rows = order[start: start + count * batch]
            run = {k: v[rows] for k, v in feeds.items()}
            run.update(values, **{LEARNING_RATE: rate, STEP: np.array(steps + 1, dtype=np.float32)})
            losses, vector = ladder.session(count).run(None, {k: v for k, v in run.items()
                                                               if k in ladder.inputs(count)})
            bad = np.flatnonzero(~np.isfinite(losses))
            if bad.size:
                raise ConvergenceError(f"the training loss is {losses[bad[0]]} at epoch {epochs_done + 1}, step "
                                       f"{steps + 1 + bad[0]}", epoch=epochs_done + 1,
                                       batch=start // batch + 1 + int(bad[0]))
            values = {FLAT_STATE: vector}
            steps += count
            for loss in losses:
                total += float(loss) * batch
            start += count * batch
        for start in range(start, n, batch):
            rows = order[start: start + batch]
            run = {k: v[rows] for k, v in feeds.items()}
            run.update(values)
            run[LEARNING_RATE] = rate
            if reads_step:
                run[STEP] = np.array(steps + 1, dtype=np.float32)
            out = session.run(None, run)
            loss = float(out[0])
            if not np.isfinite(loss):
                raise ConvergenceError(f"the training loss is {loss} at epoch {epochs_done + 1}, step {steps + 1}",
                                       epoch=epochs_done + 1, batch=start // batch + 1)
            values = {FLAT_STATE: out[1]} if flat else dict(zip(names, out[1:]))
            steps += 1
            total += loss * len(rows)
        rows_seen += n
        epochs_done += 1
        if on_epoch is not None:
            on_epoch(epochs_done, total / n)
    if flat:
        values = _unpack(package, values[FLAT_STATE].astype("<f4").tobytes(), package.tensors, "the flat state")
    return TrainingState(package, values, epochs_done, steps, rows_seen, n)


def _session(model: bytes) -> InferenceSession:
    return InferenceSession(model, make_session_options(1), providers=["CPUExecutionProvider"])


class Unrolled:
    """A package's unrolled step graphs (the manifest's ``unrolled``): which one runs next (:meth:`count`), their
    sessions made when first needed."""

    def __init__(self, package: TrainingPackage):
        self.package = package
        self.entries = {int(e["steps"]): e for e in package.manifest.get("unrolled") or []}
        self._sessions: dict[int, InferenceSession] = {}

    def count(self, rows_left: int, batch: int) -> int:
        """The steps of the largest unrolled graph that fits the full batches of ``rows_left`` rows; 0 if none."""
        return max((k for k in self.entries if k * batch <= rows_left), default=0)

    def inputs(self, count: int) -> set[str]:
        return {i["name"] for i in self.entries[count]["inputs"]}

    def session(self, count: int) -> InferenceSession:
        if count not in self._sessions:
            self._sessions[count] = _session(self.package.read(self.entries[count]["file"]))
        return self._sessions[count]


def _check_finite(what: str, array: np.ndarray, n: int) -> None:
    if len(array) != n:
        raise TrainingPackageError(f"{what} has {len(array)} rows, X has {n}")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        where = np.argwhere(~np.isfinite(array))[0].tolist()
        raise TrainingPackageError(f"{what} holds non-finite values (first at index {where})")


def _data_feeds(m: dict, X) -> dict[str, np.ndarray]:
    inputs = m["data_inputs"]
    given = X if isinstance(X, Mapping) else {inputs[0]["name"]: X} if len(inputs) == 1 else None
    if given is None or set(given) != {i["name"] for i in inputs}:
        raise TrainingPackageError(f"X must give the inputs {[i['name'] for i in inputs]}")
    feeds, n = {}, None
    for spec in inputs:
        dtype = object if spec["dtype"] == "string" else np.dtype(spec["dtype"])
        array = np.asarray(given[spec["name"]], dtype=dtype)
        shape = spec["shape"]
        if shape and len(shape) != array.ndim or any(isinstance(d, int) and d != a for d, a in
                                                      zip((shape or [])[1:], array.shape[1:])):
            raise TrainingPackageError(f"input {spec['name']!r} has shape {array.shape}; the package takes {shape}")
        n = len(array) if n is None else n
        _check_finite(f"X ({spec['name']!r})", array, n)
        feeds[spec["name"]] = array
    return feeds


def _targets(m: dict, y, n: int) -> np.ndarray:
    target = m["target"]
    if target["encoding"] != "value":
        width = target["shape"][1] if len(target["shape"]) == 2 else None
        classes = np.asarray(target["classes"], dtype=object if isinstance(target["classes"][0], str) else None)
        try:
            encoded = encode_labels(y, classes, width if isinstance(width, int) else None)
        except ValueError as exc:
            raise TrainingPackageError(f"y: {exc}") from exc
        if width == 1:
            encoded = encoded.reshape(-1, 1)
        _check_finite("y", encoded, n)
        return encoded
    array = np.asarray(y, dtype=np.float32)
    if len(target["shape"]) == 2:
        array = array.reshape(len(array), -1)
    elif array.ndim == 2 and array.shape[1] == 1:
        array = array.ravel()
    _check_finite("y", array, n)
    return array


__all__ = ["FORMAT", "FORMAT_VERSION", "TrainingPackage", "TrainingState", "average_states", "load_training_state",
           "train_package"]
