"""Writing a training package (:mod:`ortflow.package` describes the format): an ortflow trainer's graph, loss,
weights, optimizer slots, optimizer, schedule and batch size as files a runtime without Python trains from.

:func:`export_training_package` reads the trainer (fitted or not) through its public parameters and state, builds
the step graph (:func:`ortflow.autodiff.training_step`, symbolic batch axis) and its flat-state twin, writes the
prediction graph with each trained weight's byte range located (:func:`_patchable`), the state's bytes, and the
manifest with every file's SHA-256; the folder is written beside its place and moved there complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from . import graph as g
from .autodiff.training import UPDATED, training_step
from .exceptions import TrainingPackageError
from .learning_rates import LEARNING_RATE, STEP
from .package import (FLAT_STATE, FLAT_STEP_FILE, FLAT_UPDATED, FORMAT, FORMAT_VERSION, IR_VERSION, LOSS_FILE,
                      MANIFEST, PREDICT_FILE, STATE_FILE, STEP_FILE, UNROLLED_FILE, UNROLLED_LOSSES)
from .problem import TrainingProblem
from .shuffle import GENERATOR

#: what a package is made of, read from an ortflow trainer (its earlier name)
_Trainer = TrainingProblem


#: the most steps one unrolled graph holds, and the compute one run of the largest covers at most (estimated): a
#: run of onnxruntime-node costs 70-120 µs beside its compute, and copies the state in and out (D-wide: 370 kB)
MAX_UNROLLED, UNROLLED_TARGET_US = 32, 6000.0
#: the estimate of a step's time: per node, and floating-point operations per microsecond (one core, AVX), set from
#: steps timed in Python (2026-11-27, Xeon): seed case A's step 30 µs, D-wide's 1.2 ms
_NODE_US, _FLOPS_PER_US = 0.4, 100_000.0


def export_training_package(estimator, folder: str | os.PathLike, overwrite: bool = False,
                            feature_names: Sequence[str] | None = None, metadata: Mapping[str, Any] | None = None,
                            max_unrolled: int | None = None) -> Path:
    """Write the training package of ``estimator`` (an :class:`ortflow.OrtGradientOptimizer`,
    :class:`ortflow.OrtGradientForwardBackwardOptimizer` or :class:`ortflow.TorchTrainer`, fitted or not: what its
    ``training_problem()`` says) into ``folder``: its graph, loss, current weights and optimizer state, optimizer,
    schedule and batch size (see the module's docstring).

    ``feature_names`` names the columns of the data input (default: those the estimator was fitted on, when it
    saw named columns); ``metadata`` (JSON values) is stored as the manifest's ``metadata``, for the package's
    users (how the data is prepared, where the model comes from). The folder is written next to its place and moved
    there once complete; an existing non-empty ``folder`` is refused unless ``overwrite``. Returns its path.

    ``max_unrolled`` bounds the unrolled step graphs ``steps_<K>.onnx`` written (K = 2, 4, 8... up to it; 0 or 1:
    none); by default the bound is the power of two, at most :data:`MAX_UNROLLED`, whose run covers about
    :data:`UNROLLED_TARGET_US` of estimated compute (:func:`unrolled_bound`)."""
    if max_unrolled is not None and (not isinstance(max_unrolled, int) or max_unrolled < 0):
        raise TrainingPackageError(f"max_unrolled={max_unrolled!r} must be an integer >= 0")
    parts = _read_trainer(estimator)
    if feature_names is not None:
        parts.feature_names = [str(n) for n in feature_names]
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()) and not overwrite:
        raise TrainingPackageError(f"{str(folder)!r} exists and is not empty; pass overwrite=True to replace it")
    folder.parent.mkdir(parents=True, exist_ok=True)
    files, manifest = _package_files(parts, max_unrolled)
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


def _read_trainer(estimator) -> TrainingProblem:
    """What ``estimator`` trains (:meth:`ortflow.base.BaseTrainer.training_problem`)."""
    if not callable(getattr(estimator, "training_problem", None)):
        raise TrainingPackageError(f"export_training_package takes an OrtGradientOptimizer (or another ortflow "
                                   f"trainer: OrtGradientForwardBackwardOptimizer, TorchTrainer), not "
                                   f"{type(estimator).__name__}")
    return estimator.training_problem()


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


def _package_files(parts: _Trainer, max_unrolled: int | None = None) -> tuple[dict[str, bytes], dict]:
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
    bound = unrolled_bound(flat, parts.batch_size, parts.weights, parts.state) if max_unrolled is None else \
        max_unrolled
    manifest["unrolled"] = []
    count = 2
    while count <= bound and _unrollable(step):
        model = _unrolled_step(step, count, parts.batch_size, table)
        name = UNROLLED_FILE.format(count)
        files[name] = model.SerializeToString()
        manifest["unrolled"].append({
            "file": name, "steps": count, "rows": count * parts.batch_size, "state_input": FLAT_STATE,
            "state_output": FLAT_UPDATED, "losses_output": UNROLLED_LOSSES,
            "inputs": [_describe(v) for v in model.graph.input], "outputs": [_describe(v) for v in model.graph.output]})
        count *= 2
    return files, manifest


def unrolled_bound(flat: onnx.ModelProto, batch: int, weights: Sequence[str], state: Mapping[str, np.ndarray]
                   ) -> int:
    """The largest number of steps an unrolled graph of ``flat`` holds by default: the power of two (at most
    :data:`MAX_UNROLLED`) whose steps take at most :data:`UNROLLED_TARGET_US` by the estimate ``_NODE_US`` per node
    plus ``6 * batch * weights`` operations (forward and backward) at ``_FLOPS_PER_US``: a step of a small model
    (seed case A: MLP (50, 10) on 100 features, batch 15, 29 µs) gets 32, one of milliseconds (D-wide: batch 256,
    92,000 weights, 1.4 ms) 4, a step of more than :data:`UNROLLED_TARGET_US` / 2 none (1)."""
    flops = 6.0 * batch * sum(int(np.size(state[w])) for w in weights)
    step_us = _NODE_US * len(flat.graph.node) + flops / _FLOPS_PER_US
    bound = 1
    while bound * 2 <= MAX_UNROLLED and bound * 2 * step_us <= UNROLLED_TARGET_US:
        bound *= 2
    return bound


def _unrollable(step: onnx.ModelProto) -> bool:
    """Whether the nodes of ``step`` can be copied by renaming their names (no subgraph reads an outer name)."""
    return not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                   for node in step.graph.node for a in node.attribute)


def _unrolled_step(step: onnx.ModelProto, count: int, batch: int, table: list[dict]) -> onnx.ModelProto:
    """``count`` copies of the step ``step`` in one graph, each on its ``batch`` rows of the batched inputs (a
    ``Split`` of ``count * batch`` rows), copy ``i`` reading the ``<name>_updated`` tensors of copy ``i - 1`` as its
    state and the input ``step`` plus ``i`` as its step number; outputs the ``count`` losses
    (:data:`UNROLLED_LOSSES`) and the last copy's state, then made flat (:func:`_flat_step`: the state one vector in
    and out, split once and concatenated once). The copies' names are prefixed ``u<i>/``; initializers and
    ``learning_rate`` are shared."""
    graph = step.graph
    if UNROLLED_LOSSES in g.all_names(step):
        raise TrainingPackageError(f"the step graph already uses the name {UNROLLED_LOSSES!r}")
    opset = next((o.version for o in step.opset_import if o.domain in ("", "ai.onnx")), 13)
    state = {t["name"] for t in table}
    updated = {n + UPDATED for n in state}
    shared = {i.name for i in graph.initializer} | {LEARNING_RATE, ""}
    batched = {v.name for v in graph.input} - state - {LEARNING_RATE, STEP}
    nodes, inits = [], []
    sizes = helper.make_tensor("unrolled/sizes", TensorProto.INT64, [count], [batch] * count)
    for v in graph.input:
        if v.name in batched:
            pieces = [f"{v.name}/{i}" for i in range(count)]
            nodes.append(helper.make_node("Split", [v.name, sizes.name], pieces, axis=0) if opset >= 13 else
                         helper.make_node("Split", [v.name], pieces, axis=0, split=[batch] * count))
    if opset >= 13:
        inits.append(sizes)
    reads_step = any(v.name == STEP for v in graph.input)
    one = helper.make_tensor("unrolled/one", TensorProto.INT64, [1], [1])
    inits.append(one)
    for i in range(count):
        def name(x: str, i=i) -> str:
            if x in shared or (i == 0 and (x in state or x == STEP)) or (i == count - 1 and x in updated):
                return x
            if x in state:
                return f"u{i - 1}/{x}{UPDATED}"
            if x == STEP:
                return f"unrolled/{STEP}/{i}"
            if x in batched:
                return f"{x}/{i}"
            return f"u{i}/{x}"

        if reads_step and i > 0:
            offset = helper.make_tensor(f"unrolled/{STEP}/+{i}", TensorProto.FLOAT, [], [float(i)])
            inits.append(offset)
            nodes.append(helper.make_node("Add", [STEP, offset.name], [name(STEP)]))
        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"u{i}/{node.name}" if node.name else ""
            copy.input[:] = [name(x) for x in node.input]
            copy.output[:] = [name(x) for x in node.output]
            nodes.append(copy)
        nodes.append(helper.make_node("Reshape", [name(graph.output[0].name), one.name], [f"{UNROLLED_LOSSES}/{i}"]))
    nodes.append(helper.make_node("Concat", [f"{UNROLLED_LOSSES}/{i}" for i in range(count)], [UNROLLED_LOSSES],
                                  axis=0))
    inputs = []
    for v in graph.input:
        v = onnx.ValueInfoProto.FromString(v.SerializeToString())
        if v.name in batched and len(v.type.tensor_type.shape.dim):
            v.type.tensor_type.shape.dim[0].Clear()
            v.type.tensor_type.shape.dim[0].dim_value = count * batch
        inputs.append(v)
    outputs = [helper.make_tensor_value_info(UNROLLED_LOSSES, TensorProto.FLOAT, [count]), *graph.output[1:]]
    unrolled = helper.make_graph(nodes, f"{graph.name}_x{count}", inputs, outputs, [*graph.initializer, *inits])
    return _flat_step(helper.make_model(unrolled, opset_imports=list(step.opset_import), ir_version=step.ir_version,
                                        producer_name=step.producer_name), table)


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


__all__ = ["export_training_package"]
