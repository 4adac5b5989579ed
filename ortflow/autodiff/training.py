"""One standard-ONNX graph per training step: loss, gradients and the SGD update, run by a plain onnxruntime."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from .._ort import InferenceSession, OrtValue, SessionOptions
from ..graph import ModelLike, load_model
from .builder import build_gradients
from .derivative import _pick_output, _pick_weights, _value_info, assemble
from .emitter import ValueInfo

LEARNING_RATE = "learning_rate"
OPTIMIZERS = ("sgd",)


def training_step(
    loss_model: ModelLike, weights: Sequence[str] | None = None, optimizer: str = "sgd", loss_output: str | None = None
) -> onnx.ModelProto:
    """The graph of one SGD step on ``loss_model`` (a scalar loss, e.g. from :func:`ortflow.add_loss_output`).

    Inputs: the model's inputs, the trained ``weights`` (default: every float initializer), then
    ``learning_rate`` (a float scalar). Outputs: the loss (at the weights fed in), then ``<weight>_updated`` =
    ``weight - learning_rate * gradient`` for each weight, in the same order. ``loss_output`` defaults to the first
    output. Every input's first axis, when not fixed, is declared as one symbol ``batch``: a training batch
    slices all inputs by rows, and knowing it lets the gradient sum broadcast axes without run-time checks.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} is not supported by training_step; choose one of {OPTIMIZERS}")
    model = _one_batch_axis(load_model(loss_model))
    weights = _pick_weights(model, weights)
    if not weights:
        raise ValueError("training_step needs at least one float initializer to train")
    loss = _pick_output(model, loss_output)
    updated = {w: f"{w}_updated" for w in weights}
    gradients = build_gradients(model, weights, loss, taken={LEARNING_RATE, *updated.values()})
    e = gradients.emitter
    start = len(e.nodes)
    for w in weights:
        grad = gradients.grads[w] or e.zeros_like(w)
        rate = LEARNING_RATE if e.dtype(w) == TensorProto.FLOAT else e.op("Cast", [LEARNING_RATE], to=e.dtype(w))
        step = e.op("Mul", [grad, rate])
        e.nodes.append(helper.make_node("Sub", [w, step], [updated[w]], name=e.fresh(f"{updated[w]}_node")))
    update_nodes = e.nodes[start:]
    del e.nodes[start:]
    outputs = [_value_info(updated[w], e.info[w]) for w in weights]
    rate_input = _value_info(LEARNING_RATE, ValueInfo(TensorProto.FLOAT, []))
    return assemble(model, gradients, {}, [loss], [rate_input], weights, update_nodes, outputs)


def _one_batch_axis(model: onnx.ModelProto) -> onnx.ModelProto:
    new = onnx.ModelProto()
    new.CopyFrom(model)
    inits = {i.name for i in new.graph.initializer}
    for value in new.graph.input:
        tensor = value.type.tensor_type
        if value.name not in inits and tensor.HasField("shape") and tensor.shape.dim:
            dim = tensor.shape.dim[0]
            if not dim.HasField("dim_value"):
                dim.dim_param = "batch"
    return new


class TrainingStepRunner:
    """Runs a :func:`training_step` graph batch after batch. The weights live in two sets of OrtValues bound
    alternately as inputs and outputs (two IO bindings): only the batch inputs are rebound, nothing else is
    copied. ``weights`` are the initial values (name -> array, float32)."""

    def __init__(self, step_model: onnx.ModelProto, weights: dict, session_options: SessionOptions | None = None):
        options = session_options or SessionOptions()
        self.session = InferenceSession(step_model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [i.name for i in step_model.graph.input]
        self.weight_names = [o.name[: -len("_updated")] for o in step_model.graph.output[1:]]
        self.feed_names = [n for n in names if n not in self.weight_names and n != LEARNING_RATE]
        self._arrays = [{w: np.array(weights[w], dtype=np.float32) for w in self.weight_names} for _ in range(2)]
        values = [{w: OrtValue.ortvalue_from_numpy(a[w]) for w in self.weight_names} for a in self._arrays]
        self._loss = np.zeros((), dtype=np.float32)
        self._rate = np.zeros((), dtype=np.float32)
        loss_value, rate_value = OrtValue.ortvalue_from_numpy(self._loss), OrtValue.ortvalue_from_numpy(self._rate)
        self._bindings = []
        for src, dst in ((0, 1), (1, 0)):
            binding = self.session.io_binding()
            for w in self.weight_names:
                binding.bind_ortvalue_input(w, values[src][w])
                binding.bind_ortvalue_output(f"{w}_updated", values[dst][w])
            binding.bind_ortvalue_input(LEARNING_RATE, rate_value)
            binding.bind_ortvalue_output(step_model.graph.output[0].name, loss_value)
            self._bindings.append(binding)
        self._values = values
        self._current = 0

    def step(self, feeds: Sequence[np.ndarray], learning_rate: float) -> float:
        """One step on a batch (arrays in the order of :attr:`feed_names`, C-contiguous float32); returns the loss."""
        binding = self._bindings[self._current]
        for name, array in zip(self.feed_names, feeds):
            binding.bind_ortvalue_input(name, OrtValue.ortvalue_from_numpy(array))
        self._rate[...] = learning_rate
        self.session.run_with_iobinding(binding)
        self._current = 1 - self._current
        return float(self._loss)

    def epoch(self, data: Sequence[np.ndarray], batch_size: int, learning_rate: float) -> np.ndarray:
        """Consecutive batches of ``batch_size`` rows of ``data`` (the last may be shorter); the batch losses."""
        n = len(data[0])
        return np.array([self.step([d[s: s + batch_size] for d in data], learning_rate)
                         for s in range(0, n, batch_size)])

    def get_weights(self) -> dict:
        """The current weights (numpy copies)."""
        return {w: a.copy() for w, a in self._arrays[self._current].items()}


__all__ = ["LEARNING_RATE", "TrainingStepRunner", "training_step"]
