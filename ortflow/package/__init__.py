"""Training packages: what a runtime without Python needs to train an ortflow model (docs/TRAINING_OUTSIDE_PYTHON.md).

A package is a folder:

- ``step.onnx``: ortflow's full-training step (:func:`ortflow.autodiff.training_step`, symbolic batch axis ``batch``:
  one graph for every batch size, the last short batch included). Inputs: the batch (data inputs, target, sample
  weight when the graph has one), the trained weights, the optimizer's slots ``<weight>_<slot>``, ``learning_rate``
  and, for the rules that read it, ``step`` (float32 scalars); outputs: the loss, then ``<name>_updated`` for every
  state tensor in input order. Every input and output carries its ``role`` in the manifest; readers find them by
  it.
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
- ``manifest.json`` (:class:`~ortflow.package.format.Manifest`, its JSON Schema ``js/src/manifest.schema.json``):
  format and version, every tensor (shape, dtype), optimizer, schedule, batch size, loss, classes,
  feature names, the preprocessing inside the graphs (``preprocess``: the features' and the target's
  standardization, so the package takes raw rows and predicts in the target's units), the shuffle generator
  (:mod:`ortflow.data.shuffle`), the SHA-256 of every file.

A state trained elsewhere comes back as a *state file* (:meth:`TrainingState.to_bytes`): ``b"OFTS"``, a uint32
little-endian header length ``H``, ``H`` bytes of UTF-8 JSON (format, version, the package's id, the tensor table,
``epochs``, ``steps``, ``rows_seen``, ``rows``; padded with spaces to a multiple of 4 bytes), then the float32 data
laid out as the header's table says (the package's state layout). :func:`load_training_state` reads it,
:func:`train_package` is the reference training loop every other runtime is compared to. Writing a package:
:func:`export_training_package` (``ortflow.export_training_package``).

The modules: :mod:`~ortflow.package.format` (the manifest and the state header as typed records, their checks and
the JSON Schema generated for JavaScript), :mod:`~ortflow.package.state` (the state-file codec),
:mod:`~ortflow.package.graphs` (flat, unrolled and patchable graphs), :mod:`~ortflow.package.writer`,
:mod:`~ortflow.package.reader`, :mod:`~ortflow.package.loop` (the reference loop), :mod:`~ortflow.package.folder`
(SHA-256 and folders written atomically, shared with checkpoints). The names below are loaded on first use, so
``ortflow.package.folder`` alone imports none of the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

#: public name -> the module of this package that defines it
_EXPORTS = {
    **dict.fromkeys(["FLAT_STATE", "FLAT_STEP_FILE", "FLAT_UPDATED", "FORMAT", "FORMAT_VERSION", "GENERATOR",
                     "LOSS_FILE", "MANIFEST", "PREDICT_FILE", "STATE_FILE", "STATE_FORMAT", "STATE_MAGIC",
                     "STEP_FILE", "UNROLLED_FILE", "UNROLLED_LOSSES", "Manifest", "StateHeader", "inputs_by_role"],
                    "format"),
    **dict.fromkeys(["IR_VERSION", "MAX_UNROLLED", "UNROLLED_TARGET_US", "unrolled_bound"], "graphs"),
    **dict.fromkeys(["TrainingPackage", "TrainingState", "average_states", "load_training_state"], "reader"),
    **dict.fromkeys(["train_package", "_targets"], "loop"),
    **dict.fromkeys(["export_training_package"], "writer"),
}

__all__ = sorted(n for n in _EXPORTS if not n.startswith("_"))

if TYPE_CHECKING:
    from .format import (FLAT_STATE, FLAT_STEP_FILE, FLAT_UPDATED, FORMAT, FORMAT_VERSION, GENERATOR, LOSS_FILE,
                         MANIFEST, PREDICT_FILE, STATE_FILE, STATE_FORMAT, STATE_MAGIC, STEP_FILE, UNROLLED_FILE,
                         UNROLLED_LOSSES, Manifest, StateHeader, inputs_by_role)
    from .graphs import IR_VERSION, MAX_UNROLLED, UNROLLED_TARGET_US, unrolled_bound
    from .loop import _targets, train_package
    from .reader import TrainingPackage, TrainingState, average_states, load_training_state
    from .writer import export_training_package


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
