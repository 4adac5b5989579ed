"""``OrtGradientForwardBackwardOptimizer``: forward and backward passes in onnxruntime (its ``TrainingAgent`` or
ortflow's own gradient graphs), the loss and the weight update in small ONNX graphs of their own.

Per batch (the base trainer's loop copies the rows into the batch buffers): ``run_forward``, run the loss graph,
then, for a finite loss, ``run_backward`` and the update graph. Every tensor of that path lives in a buffer allocated
once (per batch size) and every binding is built once, so a batch binds nothing: the weights alternate between two
buffers and each parity has its own feeds and update binding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx

from ..graph import editing as g
from .._ort import OrtValueVector, backend
from .base import PredictionGraphTrainer
from ..data.graph_spec import GraphSpec, TrainData
from ..optimizers.learning_rates import BaseLearningRate, UpdateRuntime
from ..graph.builder import DEFAULT_OPSET
from .parameters import TRAINERS, init_from
from ..registry import register
from ..runtime.sessions import DeviceBuffer, OnnxFunction, make_session_options
from ..engines.training_runtime import TrainingRuntime
from ..runtime.placement import Placement
from ..engines.forward_backward import OrtGradientForwardBackward



@dataclass
class _Batch:
    """Buffers, feeds and bindings of one batch size. The vectors and bindings hold C OrtValues, which do not own
    the numpy memory they point to: every buffer they use must stay referenced here."""

    inputs: list  # the buffers the trainer's loop copies rows into: the data feeds', then the label's
    xs: dict  # name -> DeviceBuffer, one per data feed
    y: DeviceBuffer
    w: DeviceBuffer  # sample weights divided by n, shaped (n, 1, ...) like the label
    prediction: DeviceBuffer
    loss: DeviceBuffer
    grad: DeviceBuffer  # gradient of the loss w.r.t. the prediction
    fw_feeds: list  # one OrtValueVector per weight parity
    fw_fetches: OrtValueVector
    loss_binding: object
    bw_feeds: OrtValueVector
    agent: object  # the TrainingAgent of this batch size (static shapes) and its cache
    cache: object
    uniform: bool = False  # w holds 1 / n everywhere
    rows: object = None  # the batch's row selection (set by the trainer's loop)
    state: object = None  # the forward pass's state, which the backward pass reads

    def load_weight(self, weight: np.ndarray, rows, uniform: bool) -> None:
        """Put ``weight[rows] / n`` in ``w`` (the loss graph takes pre-scaled weights)."""
        n = self.w.shape[0]
        if uniform:
            if not self.uniform:
                self.w.write(np.full(self.w.shape, 1.0 / n, dtype=np.float32))
                self.uniform = True
            return
        self.uniform = False
        if self.w.array is None:
            self.w.write((weight[rows] / n).reshape(self.w.shape))
            return
        flat = self.w.array.reshape(n)
        if isinstance(rows, slice):
            np.multiply(weight[rows], 1.0 / n, out=flat)
        else:
            np.take(weight, rows, out=flat)
            flat *= 1.0 / n


class OrtGradientForwardBackwardOptimizer(PredictionGraphTrainer):
    """Train a prediction graph (no loss inside) by forward-backward passes.

    ``learning_loss`` and ``learning_penalty`` take an instance or a registered name (:mod:`ortflow.objectives.losses`,
    :mod:`ortflow.objectives.penalties`); ``learning_rate`` is shared with full training (:mod:`ortflow.trainers.parameters`). The
    estimator works on clones, never on the given objects. ``output_name`` picks the trained output (default: the
    only one, or ``raw_score`` when present); the exported graph keeps every output. Sample weights enter the loss
    graph through its input ``weight_name`` (default ``'weight'``).
    """

    parameters = TRAINERS["OrtGradientForwardBackwardOptimizer"]
    __init__ = init_from(parameters)
    _runtime_parameters = ("learning_loss", "learning_penalty", "output_name", "weight_name", "gradients")
    _state_file = "fwbw_state.npz"

    # --- hooks: graphs and runtime -------------------------------------------------------------------------
    def _build_runtime(self, model: onnx.ModelProto, spec: GraphSpec, rate: BaseLearningRate) -> None:
        train_graph = self._trained_graph(model, spec)
        penalty = self._penalty_object()
        runtime = ForwardBackwardRuntime(
            train_graph, self.weights_to_train_, g.get_initializers(model), spec, rate, self._loss_object(), penalty,
            self._placement(), self._session_options(), self.gradients, self.batch_size)
        self.backend_, self.gradients_ = backend(), runtime.fb.gradients_
        self._rt_runtime, self._rt_rate = runtime, rate


class ForwardBackwardRuntime(TrainingRuntime):
    """Forward-backward training's :class:`~ortflow.engines.training_runtime.TrainingRuntime`: onnxruntime's forward and
    backward passes of ``train_graph`` (an :class:`OrtGradientForwardBackward`), the loss graph of ``loss`` (its
    value and its gradient with respect to the prediction), and the update graph of ``rate`` with ``penalty`` (an
    :class:`~ortflow.optimizers.learning_rates.UpdateRuntime` holding the weights, ``inits`` at the start)."""

    def __init__(self, train_graph: onnx.ModelProto, weights: list[str], inits: dict[str, np.ndarray],
                 spec: GraphSpec, rate: BaseLearningRate, loss, penalty, placement: Placement, options,
                 gradients: str, batch_size: int):
        self.weights, self.placement, self.batch_size = list(weights), placement, batch_size
        self.device = device = placement.device
        self.fb = fb = OrtGradientForwardBackward(train_graph, self.weights, device=placement,
                                                  session_options=options, gradients=gradients)
        small = make_session_options(1 if device == "cpu" else None)  # elementwise graphs on small tensors: one thread
        self.update = UpdateRuntime(rate, {w: inits[w] for w in self.weights}, placement, penalty, small)
        self.grad_fetches = OrtValueVector()
        for name in fb.grad_names_:
            self.grad_fetches.push_back(self.update.grads_[name[: -len("_grad")]].c)
        self.loss_object, self.penalty = loss, penalty
        rank = len(spec.label_shape)
        width = spec.label_shape[1] if rank == 2 and isinstance(spec.label_shape[1], int) else None
        self.loss_fn = OnnxFunction(loss.build_onnx_function(
            DEFAULT_OPSET, device, spec.weight_name, rank=rank, scaled_weight=True, width=width), placement, small)
        self.val_loss_fn = OnnxFunction(loss.build_onnx_function(
            DEFAULT_OPSET, device, spec.weight_name, rank=rank, width=width), placement, small)
        self._run_loss, self._new_state = self.loss_fn.run_with_iobinding, fb.new_state
        self._penalty_value = self.update.penalty_buffer_  # the penalty of the weights a step read (None: none)
        self._stepper = None

    def row_arrays(self, data: TrainData) -> list[np.ndarray]:
        self._weight, self._uniform = data.weight, bool((data.weight == 1).all())
        self._feed_names = list(data.feeds)  # the trainable part's inputs (a frozen prefix's outputs)
        return [*data.feeds.values(), data.y]

    def set_learning_rate(self, learning_rate: float) -> None:
        self._stepper = self.update.stepper(learning_rate)

    def new_batch(self, n: int, arrays: list[np.ndarray]) -> _Batch:
        fb, update, device = self.fb, self.update, self.device
        *features, label = arrays
        xs = {name: DeviceBuffer((n,) + a.shape[1:], device, dtype=a.dtype) for name, a in zip(self._feed_names,
                                                                                                 features)}
        y = DeviceBuffer((n,) + label.shape[1:], device)
        w = DeviceBuffer((n,) + (1,) * (label.ndim - 1), device)
        prediction = DeviceBuffer((n,) + label.shape[1:], device)
        loss, grad = DeviceBuffer((), device), DeviceBuffer(prediction.shape, device)
        feeds = []
        for parity in (0, 1):
            values = {name: update.buffers_["weight", name][parity] for name in self.weights}
            values.update(xs)
            feeds.append(fb.feed_vector(values))
        fetches, bw_feeds = OrtValueVector(), OrtValueVector()
        fetches.push_back(prediction.c)
        bw_feeds.push_back(grad.c)
        binding = self.loss_fn.bind([prediction, y, w], [loss, grad])
        # Another batch size (the last, shorter batch) runs on one thread: a second thread pool, woken once per
        # epoch, spins against the main one on the next batches (measured: +15% per epoch on D-wide, 2 threads).
        single = make_session_options(1) if device == "cpu" and n != self.batch_size else None
        agent, cache = fb.static_agent([xs[name].shape for name in fb.input_names_], single)
        return _Batch([*xs.values(), y], xs, y, w, prediction, loss, grad, feeds, fetches, binding, bw_feeds, agent,
                      cache)

    def step(self, batch: _Batch) -> float:
        uniform = self._uniform
        if not (uniform and batch.uniform):
            batch.load_weight(self._weight, batch.rows, uniform)
        state = batch.state = self._new_state()
        batch.agent.run_forward(batch.fw_feeds[self.update.parity_], batch.fw_fetches, state, batch.cache)
        self._run_loss(batch.loss_binding, None)
        return batch.loss.scalar()

    def apply(self, batch: _Batch) -> float:
        batch.agent.run_backward(batch.bw_feeds, self.grad_fetches, batch.state)
        self._stepper()
        return 0.0 if self._penalty_value is None else self._penalty_value.scalar()

    def loss(self, data: TrainData) -> float:
        fb, current = self.fb, self.update.current()
        fb.set_weights(current)
        prediction = fb.forward([data.feeds[name] for name in fb.input_names_])[0]
        weight = data.weight if data.weight is not None else np.ones(data.n_samples, dtype=np.float32)
        loss = float(self.val_loss_fn.run(prediction, data.y, weight)[0].numpy())
        penalized = [buf for name, buf in current.items() if self.penalty.penalizes(name)]
        if not self.penalty.is_null() and penalized:
            loss += self.penalty.penalty_loss(self.device, *penalized)
        return loss

    def get_weights(self) -> dict[str, np.ndarray]:
        weights = self.update.get_weights()
        return {name: weights[name] for name in self.weights}

    def set_weights(self, values: dict[str, np.ndarray]) -> None:
        current = self.update.current()
        for name, value in values.items():
            if value.shape != current[name].shape:
                raise ValueError(f"set_state: {name!r} has shape {current[name].shape}, the value has {value.shape}")
        self.update.set_weights(values)

    def get_optimizer_state(self) -> dict[str, np.ndarray]:
        return self.update.get_state()

    def set_optimizer_state(self, state: dict[str, np.ndarray]) -> None:
        self.update.set_state(state)

    def graphs(self) -> dict:
        graphs = dict(self.fb.graphs())
        graphs["loss"] = self.loss_fn.model
        graphs["update"] = self.update.function_.model
        return graphs

register("trainer", OrtGradientForwardBackwardOptimizer)
