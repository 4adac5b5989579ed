"""Writing a training package (:mod:`ortflow.package.format` defines it): an ortflow trainer's graph, loss, weights,
optimizer slots, optimizer, schedule and batch size as files a runtime without Python trains from.

:func:`export_training_package` reads the trainer (fitted or not, :mod:`ortflow.package.trainer_parts`), builds
the step graph (:func:`ortflow.autodiff.training_step`, symbolic batch axis), its flat-state twin and the unrolled
steps (:mod:`ortflow.package.graphs`), writes the prediction graph with each trained weight's byte range located,
the state's bytes, and the manifest (a :class:`~ortflow.package.format.Manifest`, checked as any reader checks it)
with every file's SHA-256; the folder is written beside its place and moved there complete
(:func:`~ortflow.package.folder.write_folder`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from ..graph import editing as g
from ..autodiff.training import UPDATED, training_step
from ..exceptions import TrainingPackageError
from ..optimizers.learning_rates import LEARNING_RATE, STEP
from .folder import sha256_bytes, write_folder
from .format import (FLAT_STATE, FLAT_STEP_FILE, FLAT_UPDATED, FORMAT, FORMAT_VERSION, GENERATOR, LOSS_FILE, MANIFEST,
                     PREDICT_FILE, STATE_FILE, STEP_FILE, UNROLLED_FILE, UNROLLED_LOSSES, Affine, Manifest, Preprocess,
                     Shuffle)
from .graphs import (IR_VERSION, MAX_UNROLLED, PREPROCESS_KEY, UNROLLED_TARGET_US, describe, device_counts, flat_step,
                     patchable, standardize_input, unrollable, unrolled_bound, unrolled_step, unscale_output, with_ir,
                     within_buffers)
from .trainer_parts import _read_trainer, _Trainer


def export_training_package(estimator, folder: str | os.PathLike, overwrite: bool = False,
                            feature_names: Sequence[str] | None = None, metadata: Mapping[str, Any] | None = None,
                            max_unrolled: int | None = None, feature_scaling: tuple | None = None,
                            target_scaling: tuple | None = None, columns: Mapping[str, str] | None = None,
                            text_missing: str | None = None) -> Path:
    """Write the training package of ``estimator`` (an :class:`ortflow.OrtGradientOptimizer`,
    :class:`ortflow.OrtGradientForwardBackwardOptimizer` or :class:`ortflow.TorchTrainer`, fitted or not: what its
    ``training_problem()`` says) into ``folder``: its graph, loss, current
    weights and optimizer state, optimizer, schedule and batch size (see the module's docstring).

    ``feature_names`` names the columns of the data input (default: those the estimator was fitted on, when it
    saw named columns); ``metadata`` (JSON values) is stored as the manifest's ``metadata``, for the package's
    users (how the data is prepared, where the model comes from). The folder is written next to its place and moved
    there once complete; an existing non-empty ``folder`` is refused unless ``overwrite``. Returns its path.

    ``max_unrolled`` bounds the unrolled step graphs ``steps_<K>.onnx`` written (K = 2, 4, 8... up to it; 0 or 1:
    none); by default the bound is the power of two, at most :data:`~ortflow.package.graphs.MAX_UNROLLED`, whose
    run covers about :data:`~ortflow.package.graphs.UNROLLED_TARGET_US` of estimated compute
    (:func:`~ortflow.package.graphs.unrolled_bound`).

    ``feature_scaling=(mean, scale)`` (one value per column, or one for all) puts ``(X - mean) / scale`` on the
    data input inside every graph; ``target_scaling=(mean, scale)`` (a regressor) puts ``(y - mean) / scale`` on
    the target inside the step graphs and ``loss.onnx`` (the loss stays the one the estimator trained on
    standardized data) and gives the predictions back as ``value * scale + mean``: the package then trains on the
    rows as the user has them and predicts in the target's units (the manifest's ``preprocess``). ``columns``
    (name -> kind) and ``text_missing`` declare a table's cell conversions no graph does. A graph that already
    holds a package's preprocessing (a :meth:`TrainingState.estimator`'s) keeps it: pass the same maps or none."""
    if max_unrolled is not None and (type(max_unrolled) is not int or max_unrolled < 0):
        raise TrainingPackageError(f"max_unrolled={max_unrolled!r} must be an integer >= 0")
    parts = _read_trainer(estimator)
    preprocess = _preprocess(parts, feature_scaling, target_scaling)
    if columns is not None or text_missing is not None:
        preprocess.columns = None if columns is None else {str(k): str(v) for k, v in columns.items()}
        preprocess.text_missing = None if text_missing is None else str(text_missing)
    if feature_names is not None:
        parts.feature_names = [str(n) for n in feature_names]
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()) and not overwrite:
        raise TrainingPackageError(f"{str(folder)!r} exists and is not empty; pass overwrite=True to replace it")
    files, manifest = _package_files(parts, max_unrolled)
    manifest["preprocess"] = preprocess.to_json()
    try:
        manifest["metadata"] = json.loads(json.dumps(dict(metadata or {}), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TrainingPackageError(f"metadata must hold finite JSON values: {exc}") from exc
    manifest["files"] = {name: {"sha256": sha256_bytes(data), "bytes": len(data)} for name, data in files.items()}
    record = Manifest.from_json(manifest)  # what every reader checks, checked before anything is written

    def fill(tmp: Path) -> None:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        (tmp / MANIFEST).write_text(json.dumps(record.to_json(), indent=1, allow_nan=False))

    return write_folder(folder, fill)


def _package_files(parts: _Trainer, max_unrolled: int | None = None) -> tuple[dict[str, bytes], dict]:
    """The files of the package (but the manifest) and the manifest (but the checksums)."""
    loss_graph = g.replace_initializers(g.keep_outputs(parts.loss_model, [parts.loss_output]),
                                        {w: parts.state[w] for w in parts.weights})
    raw = with_ir(training_step(loss_graph, parts.weights, optimizer=parts.rate, loss_output=parts.loss_output))
    step = within_buffers(device_counts(raw))  # what a GPU runs through WebGPU too (ortflow.package.graphs)
    state_names = [o.name[: -len(UPDATED)] for o in step.graph.output[1:]]
    roles = {parts.label: "target", **({parts.weight_input: "sample_weight"} if parts.weight_input else {}),
             **dict.fromkeys(parts.weights, "weight"), LEARNING_RATE: "learning_rate", STEP: "step"}
    roles.update({n: "slot" for n in state_names if n not in parts.weights})
    step_inputs = [describe(v, role=roles.get(v.name, "data")) for v in step.graph.input]
    data_inputs = [d for d in step_inputs if d["role"] == "data"]
    target = next(d for d in step_inputs if d["role"] == "target")
    table, offset = [], 0
    for name in state_names:
        array = parts.state[name]
        table.append({"name": name, "shape": list(array.shape), "dtype": "float32", "offset": offset,
                      "length": int(array.size)})
        offset += 4 * int(array.size)
    state_bytes = b"".join(np.ascontiguousarray(parts.state[n], dtype="<f4").tobytes() for n in state_names)
    prediction = within_buffers(with_ir(g.replace_initializers(
        parts.prediction, {w: parts.state[w] for w in parts.weights
                           if w in {i.name for i in parts.prediction.graph.initializer}})))
    predict_bytes, patches = patchable(prediction, {w: parts.state[w] for w in parts.weights})
    loss_model = within_buffers(with_ir(g.replace_initializers(parts.loss_model,
                                                               {w: parts.state[w] for w in parts.weights})))
    step_bytes = step.SerializeToString()
    flat = flat_step(step, table)
    rate = parts.rate
    width = target["shape"][1] if target["shape"] and len(target["shape"]) == 2 else None
    classes = None if parts.classes is None else parts.classes.tolist()
    encoding = ("value" if classes is None else
                "binary" if not isinstance(width, int) or width == 1 else "one_hot")
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "package_id": sha256_bytes(step_bytes),
        "trainer": parts.trainer,
        "ir_version": IR_VERSION,
        "batch_size": parts.batch_size,
        "step": {"file": STEP_FILE, "batch_axis": "batch", "inputs": step_inputs,
                 "outputs": [describe(v) for v in step.graph.output], "loss_output": step.graph.output[0].name},
        "step_flat": {"file": FLAT_STEP_FILE, "batch_axis": "batch", "state_input": FLAT_STATE,
                      "state_output": FLAT_UPDATED, "inputs": [describe(v) for v in flat.graph.input],
                      "outputs": [describe(v) for v in flat.graph.output]},
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
        "predict": {"file": PREDICT_FILE, "inputs": [describe(v) for v in prediction.graph.input
                                                     if v.name not in {i.name for i in prediction.graph.initializer}],
                    "outputs": [describe(v) for v in prediction.graph.output], "weights": patches},
        "loss_model": {"file": LOSS_FILE, "label": parts.label, "weight": parts.weight_input},
        "shuffle": Shuffle(GENERATOR).to_json(),
    }
    files = {STEP_FILE: step_bytes, FLAT_STEP_FILE: flat.SerializeToString(), PREDICT_FILE: predict_bytes,
             LOSS_FILE: loss_model.SerializeToString(), STATE_FILE: state_bytes}
    bound = unrolled_bound(flat, parts.batch_size, parts.weights, parts.state) if max_unrolled is None else \
        max_unrolled
    manifest["unrolled"] = []
    count = 2
    while count <= bound and unrollable(step):
        model = unrolled_step(raw, count, parts.batch_size, table)
        name = UNROLLED_FILE.format(count)
        files[name] = model.SerializeToString()
        manifest["unrolled"].append({
            "file": name, "steps": count, "rows": count * parts.batch_size, "state_input": FLAT_STATE,
            "state_output": FLAT_UPDATED, "losses_output": UNROLLED_LOSSES,
            "inputs": [describe(v) for v in model.graph.input], "outputs": [describe(v) for v in model.graph.output]})
        count *= 2
    return files, manifest


def _preprocess(parts: _Trainer, feature_scaling, target_scaling) -> Preprocess:
    """Put the affine maps into the trainer's loss graph and prediction graph (``parts``, changed in place); the
    manifest's record of them. A graph already holding a package's maps (its ``metadata_props``) keeps them."""
    taken = {i.name for i in parts.loss_model.graph.initializer} | {parts.label, parts.weight_input}
    data = [v for v in parts.loss_model.graph.input if v.name not in taken]
    wanted = Preprocess()
    if feature_scaling is not None:
        if len(data) != 1 or data[0].type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
            raise TrainingPackageError(f"feature_scaling needs one float32 data input; the graph takes "
                                       f"{[v.name for v in data]}")
        wanted.features = _affine("feature_scaling", data[0].name, feature_scaling)
    if target_scaling is not None:
        if parts.classes is not None:
            raise TrainingPackageError("target_scaling is for a regressor's values; this graph predicts classes")
        wanted.target = _affine("target_scaling", parts.label, target_scaling)
        wanted.prediction = [o.name for o in parts.prediction.graph.output
                             if o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT]
    held = next((e.value for e in parts.loss_model.metadata_props if e.key == PREPROCESS_KEY), None)
    if held is not None:
        record = Preprocess.from_json(json.loads(held), "the graph's preprocess")
        for key in ("features", "target"):
            if getattr(wanted, key) is not None and getattr(wanted, key) != getattr(record, key):
                raise TrainingPackageError(f"the graph already holds the {key}' standardization {getattr(record, key)}"
                                           f", not the one given: pass the same or none")
        return record
    loss, prediction = parts.loss_model, parts.prediction
    if wanted.features is not None:
        f = wanted.features
        loss = standardize_input(loss, f.input, f.mean, f.scale, "preprocess/x/")
        prediction = standardize_input(prediction, f.input, f.mean, f.scale, "preprocess/x/")
    if wanted.target is not None:
        t = wanted.target
        loss = standardize_input(loss, t.input, t.mean, t.scale, "preprocess/y/")
        for name in wanted.prediction:
            prediction = unscale_output(prediction, name, t.mean, t.scale, f"preprocess/{name}/")
            if name in {o.name for o in loss.graph.output}:
                loss = unscale_output(loss, name, t.mean, t.scale, f"preprocess/{name}/")
    if wanted.features is not None or wanted.target is not None:
        for model in (loss, prediction):
            model.metadata_props.add(key=PREPROCESS_KEY, value=json.dumps(wanted.to_json()))
    parts.loss_model, parts.prediction = loss, prediction
    return wanted


def _affine(what: str, name: str, value) -> Affine:
    try:
        mean, scale = (np.asarray(v, dtype=np.float64).reshape(-1) for v in value)
    except (TypeError, ValueError) as exc:
        raise TrainingPackageError(f"{what} must be (mean, scale), numbers or arrays of numbers: {exc}") from exc
    if not (np.isfinite(mean).all() and np.isfinite(scale).all()) or (scale == 0).any() or len(mean) != len(scale):
        raise TrainingPackageError(f"{what}: mean and scale must be finite, as many, with no scale 0 "
                                   f"(mean {mean.tolist()}, scale {scale.tolist()})")
    # float32, as the graph holds them: the manifest says exactly what the graphs compute
    return Affine(name, mean.astype(np.float32).astype(float).tolist(), scale.astype(np.float32).astype(float).tolist())


def _jsonable(params: Mapping[str, Any]) -> dict:
    out = {}
    for key, value in params.items():
        if isinstance(value, (np.generic,)):
            value = value.item()
        if not isinstance(value, (int, float, str, bool, type(None))):
            raise TrainingPackageError(f"the optimizer's setting {key}={value!r} cannot be written in a manifest")
        out[key] = value
    return out


__all__ = ["export_training_package"]


__all__ = ["MAX_UNROLLED", "UNROLLED_TARGET_US", "export_training_package", "unrolled_bound"]
