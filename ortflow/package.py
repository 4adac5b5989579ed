"""Training packages: what a runtime without Python needs to train an ortflow model (docs/TRAINING_OUTSIDE_PYTHON.md).

A package is a folder:

- ``step.onnx``: ortflow's full-training step (:func:`ortflow.autodiff.training_step`, symbolic batch axis ``batch``:
  one graph for every batch size, the last short batch included). Inputs: the batch (data inputs, target, sample
  weight when the graph has one), the trained weights, the optimizer's slots ``<weight>_<slot>``, ``learning_rate``
  and, for the rules that read it, ``step`` (float32 scalars); outputs: the loss, then ``<name>_updated`` for every
  state tensor in input order.
- ``step_flat.onnx``: the same step with the whole state as one float32 vector ``state`` in and ``state_updated``
  out (``state.bin``'s layout): two state tensors cross the runtime's API per step instead of twice their number.
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
:func:`train_package` is the reference training loop every other runtime is compared to.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from . import graph as g
from ._ort import MAX_IR_VERSION, InferenceSession
from .add_loss import LOSS_METADATA, add_loss_output
from .autodiff.training import UPDATED, training_step
from .convert import graph_classes
from .exceptions import ConvergenceError, TrainingPackageError
from .learning_rates import LEARNING_RATE, STEP, BaseLearningRate
from .ml_op_rewrites import make_trainable
from .registry import family, select
from .runtime import make_session_options
from .schedules import learning_rate_at
from .shuffle import GENERATOR, epoch_order
from .validation import check_weights_to_train, encode_labels

FORMAT = "ortflow-training-package"
FORMAT_VERSION = 1
STATE_FORMAT = "ortflow-training-state"
STATE_MAGIC = b"OFTS"
MANIFEST = "manifest.json"
STEP_FILE, PREDICT_FILE, LOSS_FILE, STATE_FILE = "step.onnx", "predict.onnx", "loss.onnx", "state.bin"
FLAT_STEP_FILE = "step_flat.onnx"
#: the flat step graph's whole state, in and out (the state tensors one after the other, ``state.bin``'s layout)
FLAT_STATE, FLAT_UPDATED = "state", "state_updated"
#: the IR version of the package's graphs: onnxruntime 1.19 (the training build) to 1.32 read it
IR_VERSION = MAX_IR_VERSION
_PROBABILITIES = ("output_probability", "output_label", "probabilities", "label")


# --- export ---------------------------------------------------------------------------------------------------
@dataclass
class _Trainer:
    """What a package is made of, read from an ortflow trainer."""

    trainer: str
    loss_model: onnx.ModelProto  # the graph with its loss output, current weights inside
    loss_output: str
    label: str
    weight_input: str | None
    weights: list[str]
    rate: BaseLearningRate
    loss: dict
    prediction: onnx.ModelProto
    classes: np.ndarray | None
    state: dict[str, np.ndarray]  # weights and slots (``<weight>_<slot>``), current values
    progress: dict
    batch_size: int
    feature_names: list[str] | None = None


def export_training_package(estimator, folder: str | os.PathLike, overwrite: bool = False,
                            feature_names: Sequence[str] | None = None, metadata: Mapping[str, Any] | None = None
                            ) -> Path:
    """Write the training package of ``estimator`` (an :class:`ortflow.OrtGradientOptimizer` or
    :class:`ortflow.OrtGradientForwardBackwardOptimizer`, fitted or not) into ``folder``: its graph, loss, current
    weights and optimizer state, optimizer, schedule and batch size (see the module's docstring).

    ``feature_names`` names the columns of the data input (default: those the estimator was fitted on, when it
    saw named columns); ``metadata`` (JSON values) is stored as the manifest's ``metadata``, for the package's
    users (how the data is prepared, where the model comes from). The folder is written next to its place and moved
    there once complete; an existing non-empty ``folder`` is refused unless ``overwrite``. Returns its path."""
    parts = _read_trainer(estimator)
    if feature_names is not None:
        parts.feature_names = [str(n) for n in feature_names]
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()) and not overwrite:
        raise TrainingPackageError(f"{str(folder)!r} exists and is not empty; pass overwrite=True to replace it")
    folder.parent.mkdir(parents=True, exist_ok=True)
    files, manifest = _package_files(parts)
    try:
        manifest["metadata"] = json.loads(json.dumps(dict(metadata or {}), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TrainingPackageError(f"metadata must hold finite JSON values: {exc}") from exc
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        manifest["files"] = {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                             for name, data in files.items()}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if folder.exists():
            old = folder.with_name(f".{folder.name}-old-{os.getpid()}")
            folder.rename(old)
            tmp.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _read_trainer(estimator) -> _Trainer:
    from .full import OrtGradientOptimizer
    from .fwbw import OrtGradientForwardBackwardOptimizer

    if isinstance(estimator, OrtGradientOptimizer):
        return _full_trainer(estimator)
    if isinstance(estimator, OrtGradientForwardBackwardOptimizer):
        return _fwbw_trainer(estimator)
    raise TrainingPackageError(f"export_training_package takes an OrtGradientOptimizer or an "
                               f"OrtGradientForwardBackwardOptimizer, not {type(estimator).__name__}")


def _fitted(estimator) -> bool:
    return hasattr(estimator, "history_")


def _full_trainer(est) -> _Trainer:
    model = make_trainable(g.load_model(est.model_onnx), est.weights_to_train)
    loss, label = est.loss_output_name, est.label_name
    feeds, outputs = g.input_names(model), g.output_names(model)
    if loss not in outputs or label not in feeds:
        raise TrainingPackageError(f"the graph has no loss output {loss!r} or no label input {label!r} "
                                   f"(outputs {outputs}, inputs {feeds}); add them with ortflow.add_loss_output")
    meta = next((json.loads(e.value) for e in model.metadata_props if e.key == LOSS_METADATA), {})
    predictions = [o for o in outputs if o != loss]
    trained = meta.get("prediction") if meta.get("prediction") in predictions else (predictions or [None])[0]
    loss_graph = g.keep_outputs(model, [loss])
    weights = (list(est.weights_to_train_) if _fitted(est) else
               check_weights_to_train(model if est.weights_to_train is not None else loss_graph,
                                      est.weights_to_train))
    rate = est._learning_rate()
    state, progress = _initial_state(model, weights, rate), {"epochs": 0, "steps": 0, "rows_seen": 0}
    if _fitted(est):
        runtime = getattr(est, "_rt_step", None)
        if runtime is None and len(rate.slots) > 1:
            raise TrainingPackageError(
                f"this {type(est).__name__} trained with onnxruntime's artifacts (gradients_='onnxruntime'), whose "
                f"{type(rate).__name__} moments ortflow cannot read; export it before fit or fit it with "
                "gradients='ortflow'")
        values = runtime.get_state() if runtime is not None else dict(est.get_state())
        state.update({k: np.asarray(v, np.float32) for k, v in values.items() if k in state})
        progress = _progress(est, int(values.get(STEP, 0)))
    return _Trainer(type(est).__name__, model, loss, label, est.sample_weight_name if est.sample_weight_name in feeds
                    else None, weights, rate, {"name": meta.get("loss"), "params": meta.get("params", {})},
                    g.keep_outputs(model, predictions), None if trained in _PROBABILITIES else graph_classes(model),
                    state, progress, int(est.batch_size), _feature_names(est))


def _fwbw_trainer(est) -> _Trainer:
    from sklearn.base import clone

    from .base import prediction_spec

    model = make_trainable(g.load_model(est.model_onnx), est.weights_to_train)
    spec = prediction_spec(model, est.output_name, est.weight_name)
    penalty = select("penalty", est.learning_penalty)
    if not penalty.is_null():
        raise TrainingPackageError(f"learning_penalty={est.learning_penalty!r}: a training package holds the loss "
                                   "of add_loss_output without a penalty; train without one to export")
    loss_object = clone(select("loss", est.learning_loss))
    taken = g.all_names(model)
    loss, label = _fresh("loss", taken), _fresh("label", taken)
    weight_input = spec.weight_name if spec.weight_name not in taken else _fresh("weight", taken)
    loss_model = add_loss_output(model, loss_object, loss_name=loss, label_name=label, weight_name=weight_input,
                                 output_index=spec.trained_output)
    output = spec.trained_output
    weights = (list(est.weights_to_train_) if _fitted(est) else
               check_weights_to_train(model if est.weights_to_train is not None else g.keep_outputs(model, [output]),
                                      est.weights_to_train))
    rate = est._learning_rate()
    state, progress = _initial_state(model, weights, rate), {"epochs": 0, "steps": 0, "rows_seen": 0}
    if _fitted(est):
        state.update({k: np.asarray(v, np.float32) for k, v in est.get_state().items()})
        optimizer = est.get_optimizer_state()
        for key, value in optimizer.items():
            if ":" in key:
                slot, weight = key.split(":", 1)
                state[f"{weight}_{slot}"] = np.asarray(value, np.float32)
        progress = _progress(est, int(optimizer.get(STEP, 0)))
    return _Trainer(type(est).__name__, loss_model, loss, label, weight_input, weights, rate,
                    {"name": loss_object.names[0], "params": loss_object.get_params()},
                    g.keep_outputs(model, g.output_names(model)),
                    None if output in _PROBABILITIES else graph_classes(model), state, progress, int(est.batch_size),
                    _feature_names(est))


def _fresh(base: str, taken: set) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    return name


def _initial_state(model: onnx.ModelProto, weights: list[str], rate: BaseLearningRate) -> dict[str, np.ndarray]:
    inits = g.get_initializers(model)
    state = {w: np.asarray(inits[w], np.float32) for w in weights}
    for w in weights:
        for slot in rate.slots[1:]:
            state[f"{w}_{slot}"] = np.asarray(rate._initial_slot(slot, state[w]), np.float32)
    return state


def _progress(est, steps: int) -> dict:
    return {"epochs": len(est.history_), "steps": steps, "rows_seen": int(getattr(est, "_samples_seen", 0) or 0)}


def _feature_names(est) -> list[str] | None:
    names = getattr(est, "feature_names_in_", None)
    return None if names is None else [str(n) for n in names]


def _dtype(elem_type: int) -> str:
    return "string" if elem_type == TensorProto.STRING else helper.tensor_dtype_to_np_dtype(elem_type).name


def _shape(value: onnx.ValueInfoProto) -> list:
    t = value.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]


def _describe(value: onnx.ValueInfoProto, **extra) -> dict:
    return {"name": value.name, "shape": _shape(value), "dtype": _dtype(value.type.tensor_type.elem_type), **extra}


def _with_ir(model: onnx.ModelProto) -> onnx.ModelProto:
    model.ir_version = min(model.ir_version or IR_VERSION, IR_VERSION)
    return model


def _package_files(parts: _Trainer) -> tuple[dict[str, bytes], dict]:
    """The files of the package (but the manifest) and the manifest (but the checksums)."""
    loss_graph = g.replace_initializers(g.keep_outputs(parts.loss_model, [parts.loss_output]),
                                        {w: parts.state[w] for w in parts.weights})
    step = _with_ir(training_step(loss_graph, parts.weights, optimizer=parts.rate, loss_output=parts.loss_output))
    state_names = [o.name[: -len(UPDATED)] for o in step.graph.output[1:]]
    roles = {parts.label: "target", **({parts.weight_input: "sample_weight"} if parts.weight_input else {}),
             **dict.fromkeys(parts.weights, "weight"), LEARNING_RATE: "learning_rate", STEP: "step"}
    roles.update({n: "slot" for n in state_names if n not in parts.weights})
    step_inputs = [_describe(v, role=roles.get(v.name, "data")) for v in step.graph.input]
    data_inputs = [d for d in step_inputs if d["role"] == "data"]
    target = next(d for d in step_inputs if d["role"] == "target")
    table, offset = [], 0
    for name in state_names:
        array = parts.state[name]
        table.append({"name": name, "shape": list(array.shape), "dtype": "float32", "offset": offset,
                      "length": int(array.size)})
        offset += 4 * int(array.size)
    state_bytes = b"".join(np.ascontiguousarray(parts.state[n], dtype="<f4").tobytes() for n in state_names)
    prediction = _with_ir(g.replace_initializers(parts.prediction,
                                                 {w: parts.state[w] for w in parts.weights
                                                  if w in {i.name for i in parts.prediction.graph.initializer}}))
    predict_bytes, patches = _patchable(prediction, {w: parts.state[w] for w in parts.weights})
    loss_model = _with_ir(g.replace_initializers(parts.loss_model, {w: parts.state[w] for w in parts.weights}))
    step_bytes = step.SerializeToString()
    flat = _flat_step(step, table)
    rate = parts.rate
    width = target["shape"][1] if target["shape"] and len(target["shape"]) == 2 else None
    classes = None if parts.classes is None else parts.classes.tolist()
    encoding = ("value" if classes is None else
                "binary" if not isinstance(width, int) or width == 1 else "one_hot")
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "package_id": hashlib.sha256(step_bytes).hexdigest(),
        "trainer": parts.trainer,
        "ir_version": IR_VERSION,
        "batch_size": parts.batch_size,
        "step": {"file": STEP_FILE, "batch_axis": "batch", "inputs": step_inputs,
                 "outputs": [_describe(v) for v in step.graph.output], "loss_output": step.graph.output[0].name},
        "step_flat": {"file": FLAT_STEP_FILE, "batch_axis": "batch", "state_input": FLAT_STATE,
                      "state_output": FLAT_UPDATED, "inputs": [_describe(v) for v in flat.graph.input],
                      "outputs": [_describe(v) for v in flat.graph.output]},
        "data_inputs": data_inputs,
        "feature_names": parts.feature_names,
        "target": {**target, "classes": classes, "encoding": encoding},
        "sample_weight": None if parts.weight_input is None else parts.weight_input,
        "loss": {"output": parts.loss_output, **parts.loss},
        "optimizer": {"name": rate.names[0], "class": type(rate).__name__, "params": _jsonable(rate.get_params()),
                      "slots": list(rate.slots[1:]), "reads_step": STEP in {i.name for i in step.graph.input}},
        "schedule": {"name": getattr(rate, "schedule", "constant"), "eta0": float(rate.eta0),
                     "power_t": float(getattr(rate, "power_t", 0.25)), "alpha": float(getattr(rate, "alpha", 1e-4)),
                     "per": "epoch", "of": "rows_seen"},
        "state": {"file": STATE_FILE, "dtype": "float32", "byte_order": "little", "bytes": len(state_bytes),
                  "tensors": table, "weights": list(parts.weights)},
        "progress": dict(parts.progress),
        "predict": {"file": PREDICT_FILE, "inputs": [_describe(v) for v in prediction.graph.input
                                                     if v.name not in {i.name for i in prediction.graph.initializer}],
                    "outputs": [_describe(v) for v in prediction.graph.output], "weights": patches},
        "loss_model": {"file": LOSS_FILE, "label": parts.label, "weight": parts.weight_input},
        "shuffle": {"generator": GENERATOR, "seed": "uint32", "epoch": "epochs completed before, from 0",
                    "module": "ortflow.shuffle"},
    }
    files = {STEP_FILE: step_bytes, FLAT_STEP_FILE: flat.SerializeToString(), PREDICT_FILE: predict_bytes,
             LOSS_FILE: loss_model.SerializeToString(), STATE_FILE: state_bytes}
    return files, manifest


def _flat_step(step: onnx.ModelProto, table: list[dict]) -> onnx.ModelProto:
    """``step`` taking the whole state as one float32 vector :data:`FLAT_STATE` (the tensors of ``table`` one after
    the other) and giving it back as :data:`FLAT_UPDATED`, the loss first: the same nodes between a ``Split`` and
    ``Reshape`` of the vector and a ``Concat`` of the updated tensors. A runtime that copies every input and output
    at each run (onnxruntime-node, onnxruntime-web) crosses 2 state tensors per step instead of twice their number,
    and feeds each step's output vector to the next step as it is."""
    names = [t["name"] for t in table]
    taken = g.all_names(step)
    clash = sorted({FLAT_STATE, FLAT_UPDATED} & taken)
    if clash:
        raise TrainingPackageError(f"the step graph already uses the names {clash}")
    opset = next((o.version for o in step.opset_import if o.domain in ("", "ai.onnx")), 13)
    sizes = [int(np.prod(t["shape"], dtype=np.int64)) for t in table]
    total = int(sum(sizes))
    nodes, inits = [], []
    pieces = [f"{FLAT_STATE}/{n}" for n in names]
    split_sizes = helper.make_tensor(f"{FLAT_STATE}/sizes", TensorProto.INT64, [len(sizes)], sizes)
    if opset >= 13:
        inits.append(split_sizes)
        nodes.append(helper.make_node("Split", [FLAT_STATE, split_sizes.name], pieces, axis=0))
    else:
        nodes.append(helper.make_node("Split", [FLAT_STATE], pieces, axis=0, split=sizes))
    for t, piece in zip(table, pieces):
        shape = helper.make_tensor(f"{piece}/shape", TensorProto.INT64, [len(t["shape"])], list(t["shape"]))
        inits.append(shape)
        nodes.append(helper.make_node("Reshape", [piece, shape.name], [t["name"]]))
    flat_shape = helper.make_tensor(f"{FLAT_UPDATED}/flat", TensorProto.INT64, [1], [-1])
    inits.append(flat_shape)
    tail = []
    for name in names:
        tail.append(helper.make_node("Reshape", [name + UPDATED, flat_shape.name], [f"{FLAT_UPDATED}/{name}"]))
    tail.append(helper.make_node("Concat", [f"{FLAT_UPDATED}/{n}" for n in names], [FLAT_UPDATED], axis=0))
    graph = step.graph
    state = set(names)
    vector = helper.make_tensor_value_info(FLAT_STATE, TensorProto.FLOAT, [total])
    inputs = [v for v in graph.input if v.name not in state]
    first_scalar = next((i for i, v in enumerate(inputs) if v.name in (LEARNING_RATE, STEP)), len(inputs))
    inputs.insert(first_scalar, vector)
    outputs = [graph.output[0], helper.make_tensor_value_info(FLAT_UPDATED, TensorProto.FLOAT, [total])]
    flat = helper.make_graph([*nodes, *graph.node, *tail], f"{graph.name}_flat", inputs, outputs,
                             [*graph.initializer, *inits], value_info=list(graph.value_info))
    model = helper.make_model(flat, opset_imports=list(step.opset_import), ir_version=step.ir_version,
                              producer_name=step.producer_name)
    return model


def _jsonable(params: Mapping[str, Any]) -> dict:
    out = {}
    for key, value in params.items():
        if isinstance(value, (np.generic,)):
            value = value.item()
        if not isinstance(value, (int, float, str, bool, type(None))):
            raise TrainingPackageError(f"the optimizer's setting {key}={value!r} cannot be written in a manifest")
        out[key] = value
    return out


def _patchable(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> tuple[bytes, list[dict]]:
    """``model`` serialized with the float32 initializers ``values`` in ``raw_data``, and where each one's bytes
    lie in it: ``[{name, shape, offset, bytes}]``. The offsets are found by writing a distinct random pattern in
    each initializer (same length: the serialized layout does not change), locating it once, then writing the
    values there."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    inits = {i.name: i for i in model.graph.initializer}
    values = {n: np.ascontiguousarray(v, dtype="<f4") for n, v in values.items() if n in inits}
    for name in values:
        if inits[name].data_type != TensorProto.FLOAT:
            raise TrainingPackageError(f"weight {name!r} of the prediction graph is not float32")
    rng = np.random.default_rng(0)
    for _ in range(16):
        patterns = {}
        for name, array in values.items():
            init = inits[name]
            init.ClearField("float_data")
            init.ClearField("external_data")
            init.data_location = TensorProto.DEFAULT
            patterns[name] = rng.integers(0, 256, size=array.nbytes, dtype=np.uint8).tobytes()
            init.raw_data = patterns[name]
        data = bytearray(model.SerializeToString())
        offsets = {}
        for name, pattern in patterns.items():
            at = data.find(pattern) if pattern else 0
            if at < 0 or (pattern and data.find(pattern, at + 1) >= 0):
                break
            offsets[name] = at
        else:
            for name, at in offsets.items():
                data[at: at + values[name].nbytes] = values[name].tobytes()
            return bytes(data), [{"name": n, "shape": list(values[n].shape), "offset": offsets[n],
                                  "bytes": values[n].nbytes} for n in values]
    raise TrainingPackageError("could not locate the weights' bytes in the prediction graph")  # pragma: no cover


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
        from .full import OrtGradientOptimizer

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
                  on_epoch: Callable[[int, float], None] | None = None, flat: bool = False) -> TrainingState:
    """Train the package's step graph with onnxruntime over (X, y), as every other runtime does: ``epochs``
    epochs from ``state`` (default the package's own); each epoch's learning rate from the schedule at the rows
    seen before it, its row order :func:`ortflow.shuffle.epoch_order` ``(n, seed mod 2**32, epochs completed)``
    (or the rows as given without ``shuffle``), batches of ``batch_size`` rows (the last one shorter), ``step``
    counting the updates from the state's. ``X``: an array (one data input) or a dict input name -> array; ``y``:
    targets, or class labels of a classifier. ``on_epoch(epoch, mean loss)`` is called after each epoch. ``flat``
    runs ``step_flat.onnx`` (the state as one vector) instead of ``step.onnx``: the same nodes, the same result.
    Returns the new state."""
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
    session = InferenceSession(package.read(FLAT_STEP_FILE if flat else STEP_FILE), make_session_options(1),
                               providers=["CPUExecutionProvider"])
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
        for start in range(0, n, batch):
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


__all__ = ["FORMAT", "FORMAT_VERSION", "TrainingPackage", "TrainingState", "average_states",
           "export_training_package", "load_training_state", "train_package"]
