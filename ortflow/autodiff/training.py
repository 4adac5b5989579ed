"""One standard-ONNX graph per training step: loss, gradients and the SGD or Adam update, run by a plain
onnxruntime."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from .._ort import InferenceSession, OrtValue, SessionOptions
from ..graph import ModelLike, all_names, load_model
from .builder import build_gradients, refuse_unreached
from .derivative import assemble, pick_output, pick_weights, value_info
from .emitter import Emitter, ValueInfo

LEARNING_RATE = "learning_rate"
STEP = "step"
OPTIMIZERS = ("sgd", "adam", "adamw")
UPDATED = "_updated"


def training_step(
    loss_model: ModelLike,
    weights: Sequence[str] | None = None,
    optimizer: str = "sgd",
    loss_output: str | None = None,
    betas: tuple[float, float] = (0.9, 0.999),
    epsilon: float = 1e-8,
    weight_decay: float = 0.0,
    batch_rows: int | None = None,
) -> onnx.ModelProto:
    """The graph of one optimizer step on ``loss_model`` (a scalar loss, e.g. from :func:`ortflow.add_loss_output`).

    Inputs: the model's inputs, the trained ``weights`` (default: every float initializer), for Adam the moments
    ``<weight>_m`` and ``<weight>_v`` of each weight, then ``learning_rate`` and, for Adam, ``step`` (float
    scalars; ``step`` counts updates from 1). Outputs: the loss (at the weights fed in), then ``<name>_updated``
    for each weight and moment, in input order.

    - ``'sgd'``: ``w - learning_rate * g``.
    - ``'adam'`` / ``'adamw'``: onnxruntime-training's AdamW in its default (Hugging Face) mode:
      ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g**2``,
      ``w -= learning_rate * sqrt(1 - b2**step) / (1 - b1**step) * m / (sqrt(v) + epsilon)``, then for
      ``'adamw'`` ``w -= learning_rate * weight_decay * w`` (``'adam'`` has no decay). The defaults are those of
      :class:`ortflow.LearningRateAdam`, which full training hands to onnxruntime.

    ``loss_output`` defaults to the first output. Every input's first axis, when not fixed, is declared as one
    symbol ``batch``: a training batch slices all inputs by rows, and knowing it lets the gradient sum broadcast
    axes without run-time checks. With ``batch_rows`` that axis is fixed to this many rows: a graph for one batch
    shape, whose shape computations (counts, broadcast shapes) are constants.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} is not supported by training_step; choose one of {OPTIMIZERS}")
    if optimizer != "adamw" and weight_decay:
        raise ValueError(f"weight_decay={weight_decay} applies to optimizer='adamw' only, not {optimizer!r}")
    model = _one_batch_axis(load_model(loss_model), batch_rows)
    weights = pick_weights(model, weights)
    if not weights:
        raise ValueError("training_step needs at least one float initializer to train")
    wide = [w for w in weights if _init_type(model, w) != TensorProto.FLOAT]
    if wide:
        raise ValueError(f"training_step trains float32 weights; {wide} have another type")
    loss = pick_output(model, loss_output)
    declared = {v.name: v for v in model.graph.output}[loss].type.tensor_type
    if declared.HasField("shape") and declared.shape.dim:
        raise ValueError(f"loss output {loss!r} has rank {len(declared.shape.dim)}; training_step needs a scalar loss")
    moments = [f"{w}_{k}" for w in weights for k in "mv"] if optimizer != "sgd" else []
    state = weights + moments
    scalars = [LEARNING_RATE] + ([STEP] if moments else [])
    new_names = {*scalars, *moments, *(s + UPDATED for s in state)}
    clash = sorted(new_names & all_names(model))
    if clash:
        raise ValueError(f"training_step adds the names {clash}, which already exist in the graph; rename them")
    # SGD seeds the backward pass with the (float) learning rate when the loss is float too: the gradients come out
    # already scaled and each update is one Sub (one Mul per weight fewer)
    scaled = optimizer == "sgd" and declared.elem_type == TensorProto.FLOAT
    gradients = build_gradients(model, weights, loss, seed=LEARNING_RATE if scaled else None, taken=new_names)
    refuse_unreached(model, [w for w in weights if gradients.grads[w] is None], loss)
    e = gradients.emitter
    grads = dict(gradients.grads)
    for name in scalars + moments:
        e.info[name] = ValueInfo(TensorProto.FLOAT, [] if name in scalars else e.info[name[:-2]].shape)
    if scaled:
        for w in weights:
            if not _update_in_gemm(e, w, grads[w]):
                e.op_named("Sub", [w, grads[w]], w + UPDATED)
    elif optimizer == "sgd":  # a loss of another type (e.g. double over float weights): scaled at the end
        for w in weights:
            e.op_named("Sub", [w, e.op("Mul", [grads[w], LEARNING_RATE])], w + UPDATED)
    else:
        _adam(e, weights, grads, betas, epsilon, weight_decay)
    outputs = [value_info(s + UPDATED, e.info[s]) for s in state]
    inputs = [value_info(m, e.info[m]) for m in moments] + [value_info(s, e.info[s]) for s in scalars]
    return assemble(model, gradients, {}, [loss], inputs, weights, outputs)


def _update_in_gemm(e: Emitter, weight: str, grad: str) -> bool:
    """When ``grad`` is the only use of a two-input Gemm's output, make that Gemm write ``weight - grad`` itself
    (``C=weight, alpha=-alpha, beta=1``): one node and one weight-sized buffer fewer per step."""
    producer = next((node for node in reversed(e.nodes) if grad in node.output), None)
    if producer is None or producer.op_type != "Gemm" or len(producer.input) != 2:
        return False
    if any(grad in node.input for node in e.nodes):
        return False
    alpha = next((a.f for a in producer.attribute if a.name == "alpha"), 1.0)
    kept = [a for a in producer.attribute if a.name not in ("alpha", "beta")]
    del producer.attribute[:]
    producer.attribute.extend([*kept, helper.make_attribute("alpha", -alpha), helper.make_attribute("beta", 1.0)])
    producer.input.append(weight)
    producer.output[0] = weight + UPDATED
    return True


def _init_type(model: onnx.ModelProto, name: str) -> int:
    return next(i.data_type for i in model.graph.initializer if i.name == name)


def _adam(e: Emitter, weights: list, grads: dict, betas: tuple, epsilon: float, weight_decay: float) -> None:
    b1, b2 = (float(b) for b in betas)
    one = e.const(1.0, dtype=TensorProto.FLOAT)
    bias1 = e.op("Sub", [one, e.op("Pow", [e.const(b1, dtype=TensorProto.FLOAT), STEP])])
    bias2 = e.op("Sub", [one, e.op("Pow", [e.const(b2, dtype=TensorProto.FLOAT), STEP])])
    step_size = e.op("Div", [e.op("Mul", [LEARNING_RATE, e.op("Sqrt", [bias2])]), bias1])
    c = {name: e.const(value, dtype=TensorProto.FLOAT)
         for name, value in (("b1", b1), ("1-b1", 1 - b1), ("b2", b2), ("1-b2", 1 - b2), ("eps", epsilon))}
    for w in weights:
        g, m, v = grads[w], f"{w}_m", f"{w}_v"
        m_new = e.op_named("Add", [e.op("Mul", [m, c["b1"]]), e.op("Mul", [g, c["1-b1"]])], m + UPDATED)
        v_new = e.op_named("Add", [e.op("Mul", [v, c["b2"]]), e.op("Mul", [e.op("Mul", [g, g]), c["1-b2"]])],
                           v + UPDATED)
        denominator = e.op("Add", [e.op("Sqrt", [v_new]), c["eps"]])
        moved = e.op("Sub", [w, e.op("Mul", [step_size, e.op("Div", [m_new, denominator])])])
        if weight_decay:
            decay = e.op("Mul", [LEARNING_RATE, e.const(float(weight_decay), dtype=TensorProto.FLOAT)])
            e.op_named("Sub", [moved, e.op("Mul", [moved, decay])], w + UPDATED)
        else:
            e.op_named("Identity", [moved], w + UPDATED)


def _one_batch_axis(model: onnx.ModelProto, rows: int | None = None) -> onnx.ModelProto:
    new = onnx.ModelProto()
    new.CopyFrom(model)
    inits = {i.name for i in new.graph.initializer}
    for value in new.graph.input:
        tensor = value.type.tensor_type
        if value.name not in inits and tensor.HasField("shape") and tensor.shape.dim:
            dim = tensor.shape.dim[0]
            if not dim.HasField("dim_value"):
                if rows is None:
                    dim.dim_param = "batch"
                else:
                    dim.dim_value = int(rows)
    return new


class TrainingStepRunner:
    """Runs a :func:`training_step` graph batch after batch. The state (weights, moments) lives in two sets of
    OrtValues bound alternately as inputs and outputs (two IO bindings): only the batch inputs are rebound, nothing
    else is copied. ``weights`` are the initial weights (name -> float32 array); moments start at zero."""

    def __init__(self, step_model: onnx.ModelProto, weights: dict, session_options: SessionOptions | None = None):
        options = session_options or SessionOptions()
        self.session = InferenceSession(step_model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        inputs = {i.name: i for i in step_model.graph.input}
        self.state_names = [o.name[: -len(UPDATED)] for o in step_model.graph.output[1:]]
        self.feed_names = [n for n in inputs if n not in self.state_names and n not in (LEARNING_RATE, STEP)]
        start = {}
        for name in self.state_names:
            if name in weights:
                start[name] = np.array(weights[name], dtype=np.float32)
            else:
                dims = [d.dim_value for d in inputs[name].type.tensor_type.shape.dim]
                start[name] = np.zeros(dims, dtype=np.float32)
        self._arrays = [{n: a.copy() for n, a in start.items()} for _ in range(2)]
        values = [{n: OrtValue.ortvalue_from_numpy(a[n]) for n in self.state_names} for a in self._arrays]
        self._loss = np.zeros((), dtype=np.float32)
        self._scalars = {n: np.zeros((), dtype=np.float32) for n in (LEARNING_RATE, STEP) if n in inputs}
        loss_value = OrtValue.ortvalue_from_numpy(self._loss)
        scalar_values = {n: OrtValue.ortvalue_from_numpy(a) for n, a in self._scalars.items()}
        self._bindings = []
        for src, dst in ((0, 1), (1, 0)):
            binding = self.session.io_binding()
            for name in self.state_names:
                binding.bind_ortvalue_input(name, values[src][name])
                binding.bind_ortvalue_output(name + UPDATED, values[dst][name])
            for name, value in scalar_values.items():
                binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(step_model.graph.output[0].name, loss_value)
            self._bindings.append(binding)
        self._values = values  # the bindings hold the C objects only
        self._current = 0
        self.steps = 0

    def step(self, feeds: Sequence[np.ndarray], learning_rate: float) -> float:
        """One step on a batch (arrays in the order of :attr:`feed_names`, C-contiguous float32); returns the loss."""
        binding = self._bindings[self._current]
        for name, array in zip(self.feed_names, feeds):
            binding.bind_ortvalue_input(name, OrtValue.ortvalue_from_numpy(array))
        self.steps += 1
        self._scalars[LEARNING_RATE][...] = learning_rate
        if STEP in self._scalars:
            self._scalars[STEP][...] = self.steps
        self.session.run_with_iobinding(binding)
        self._current = 1 - self._current
        return float(self._loss)

    def epoch(self, data: Sequence[np.ndarray], batch_size: int, learning_rate: float) -> np.ndarray:
        """Consecutive batches of ``batch_size`` rows of ``data`` (the last may be shorter); the batch losses."""
        n = len(data[0])
        return np.array([self.step([d[s: s + batch_size] for d in data], learning_rate)
                         for s in range(0, n, batch_size)])

    def get_weights(self) -> dict:
        """The current weights and moments (numpy copies)."""
        return {n: a.copy() for n, a in self._arrays[self._current].items()}


__all__ = ["LEARNING_RATE", "OPTIMIZERS", "STEP", "TrainingStepRunner", "training_step"]
