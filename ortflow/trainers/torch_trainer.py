"""``TorchTrainer``: a prediction graph trained as a torch layer (:class:`ortflow.torch.OnnxModule`) by a torch
optimizer, on the epoch loop, callbacks, history, early stopping, divergence handling and checkpoints of
:class:`ortflow.trainers.base.BaseTrainer`.

Forward and backward run in onnxruntime through the layer; the loss is the loss family's own graph (its value and
its gradient with respect to the prediction, :meth:`ortflow.objectives.losses.BaseLearningLoss.loss_gradient`), so the three
trainers minimize the same loss. The update is the optimizer's one rule on torch tensors
(:class:`ortflow.torch.RuleOptimizer`), its rate set every epoch from ``value_at`` like
the other trainers: the three trainers take the same steps.

Like the other trainers it says what it trains (``training_problem()``), so it exports a training package
(:func:`ortflow.export_training_package`), whose step is ortflow's step graph of the same loss and optimizer.

torch is imported when the trainer fits (``import ortflow`` does not import it): ``pip install 'ortflow[torch]'``.
"""

from __future__ import annotations


import numpy as np
import onnx

from ..graph import editing as g
from .._ort import backend
from .base import PredictionGraphTrainer
from ..data.graph_spec import GraphSpec, TrainData
from ..optimizers.learning_rates import BaseLearningRate, slot_name
from .parameters import TRAINERS, init_from
from ..registry import register
from ..runtime.sessions import DeviceBuffer, OnnxFunction, make_session_options
from ..engines.training_runtime import TrainingRuntime



def _family_loss(function):
    """A torch autograd function computing the loss graph ``function`` (an :class:`ortflow.runtime.sessions.OnnxFunction`
    of inputs prediction, label, weight and outputs loss, loss_grad) on torch tensors."""
    import torch

    class FamilyLoss(torch.autograd.Function):
        @staticmethod
        def forward(ctx, prediction, label, weight):
            loss, grad = function.run(prediction.detach().numpy(), label.numpy(), weight.numpy())
            ctx.save_for_backward(torch.from_numpy(grad.numpy()))
            return torch.tensor(float(loss.numpy()), dtype=torch.float64)

        @staticmethod
        def backward(ctx, upstream):
            (grad,) = ctx.saved_tensors
            return grad * upstream.to(grad.dtype), None, None

    return FamilyLoss.apply


def _penalty_value(penalty):
    """A torch autograd function: the summed penalty of its weight tensors, its gradient the penalty's own
    (:meth:`ortflow.objectives.penalties.BaseLearningPenalty.gradient`), as forward-backward training adds it."""
    import torch

    class PenaltyValue(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *weights):
            ctx.save_for_backward(*weights)
            return torch.as_tensor(penalty.value(weights), dtype=torch.float64)

        @staticmethod
        def backward(ctx, upstream):
            return tuple(penalty.gradient(w, torch.zeros_like(w)) * upstream.to(w.dtype) for w in ctx.saved_tensors)

    return PenaltyValue.apply


class _TorchBatch:
    """The host buffers of one batch size (data feeds, label, sample weight), the torch tensors sharing their memory,
    and the weights divided by the batch's rows as the loss graph takes them."""

    def __init__(self, inputs: list[DeviceBuffer]):
        import torch

        self.inputs = inputs
        self.tensors = [torch.from_numpy(b.array) for b in inputs]
        label = inputs[-2].array
        self.scaled = np.empty(len(label), dtype=np.float32)
        self.scaled_tensor = torch.from_numpy(self.scaled.reshape((-1,) + (1,) * (label.ndim - 1)))
        self.rows = self.total = None


class TorchTrainer(PredictionGraphTrainer):
    """Train a prediction graph (no loss inside) as an :class:`ortflow.torch.OnnxModule` with a torch optimizer.

    Parameters are those of :class:`ortflow.OrtGradientForwardBackwardOptimizer` (:data:`ortflow.trainers.parameters.TORCH`)
    without ``gradients`` and with ``device='cpu'`` only: ``learning_loss``/``learning_penalty`` are the loss and
    penalty families' names or objects, ``learning_rate`` a float (SGD following ``lr_schedule``), a registered
    optimizer name (``ortflow.registry.names('optimizer')``) or a :class:`ortflow.BaseLearningRate`. After ``fit``,
    ``module_`` is the torch layer and ``optimizer_`` the torch optimizer.
    """

    parameters = TRAINERS["TorchTrainer"]
    __init__ = init_from(parameters)
    _runtime_parameters = ("learning_loss", "learning_penalty", "output_name", "weight_name")
    _state_file = "torch_state.npz"

    # --- hooks: graphs and runtime -------------------------------------------------------------------------
    def _build_runtime(self, model: onnx.ModelProto, spec: GraphSpec, rate: BaseLearningRate) -> None:
        train_graph = self._trained_graph(model, spec)
        self.backend_ = backend()
        penalty = self._penalty_object()
        penalty.check()
        runtime = TorchRuntime(train_graph, self.weights_to_train_, spec, rate, self._loss_object(), penalty,
                               getattr(self, "n_threads_", self.n_threads), bool(self.spinning))
        self._rt_runtime, self._rt_rate = runtime, rate
        self.module_, self.optimizer_ = runtime.module, runtime.optimizer


class TorchRuntime(TrainingRuntime):
    """The torch trainer's :class:`~ortflow.engines.training_runtime.TrainingRuntime`: ``train_graph`` as an
    :class:`ortflow.torch.OnnxModule` training ``weights``, the loss family's graph ``loss`` as an autograd function,
    ``penalty`` by its own rule, and the update rule of ``rate`` as a torch optimizer
    (:class:`ortflow.torch.RuleOptimizer`)."""

    def __init__(self, train_graph: onnx.ModelProto, weights: list[str], spec: GraphSpec, rate: BaseLearningRate,
                 loss, penalty, n_threads: int | None, spinning: bool):
        from ..torch import OnnxModule, RuleOptimizer

        self.module = module = OnnxModule(train_graph, weights_to_train=weights, n_threads=n_threads,
                                          spinning=spinning)
        rank = len(spec.label_shape)
        width = spec.label_shape[1] if rank == 2 and isinstance(spec.label_shape[1], int) else None
        # the loss graph of forward-backward training: weights pre-scaled by 1 / rows, the same roundings
        function = OnnxFunction(loss.build_onnx_function(weight_name="weight", rank=rank, width=width,
                                                         scaled_weight=True), "cpu", make_session_options(1))
        self.rate, self.loss_fn = rate, _family_loss(function)
        self.penalty, self.penalty_fn = penalty, _penalty_value(penalty)
        self.optimizer = RuleOptimizer(list(module.parameters()), rate)

    def _penalty(self):
        """The penalty's value on the weights it applies to, as a torch scalar (0 without penalty), by the penalty's
        own rule (:meth:`ortflow.objectives.penalties.BaseLearningPenalty.value` and ``gradient``)."""
        penalty = self.penalty
        if penalty.is_null():
            return 0.0
        params = [p for n, p in self.module.parameters_by_initializer().items() if penalty.penalizes(n)]
        return self.penalty_fn(*params) if params else 0.0

    def _tensors(self, data: TrainData, rows):
        import torch

        y, weight = data.y[rows], data.weight[rows]
        scaled = np.multiply(weight, 1.0 / len(weight)).astype(np.float32).reshape((-1,) + (1,) * (y.ndim - 1))
        xs = [torch.from_numpy(np.ascontiguousarray(data.feeds[name][rows])) for name in self.module.input_names_]
        return xs, torch.from_numpy(y), torch.from_numpy(scaled)

    def set_learning_rate(self, learning_rate: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        self.module.train()

    def row_arrays(self, data: TrainData) -> list[np.ndarray]:
        return [*(data.feeds[name] for name in self.module.input_names_), data.y, data.weight]

    def new_batch(self, n: int, arrays: list[np.ndarray]) -> _TorchBatch:
        return _TorchBatch([DeviceBuffer((n, *a.shape[1:]), "cpu", dtype=a.dtype) for a in arrays])

    def step(self, batch: _TorchBatch) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        *xs, y, weight = batch.tensors
        np.multiply(batch.inputs[-1].array, 1.0 / len(batch.scaled), out=batch.scaled)  # the weights divided by n
        loss = self.loss_fn(self.module(*xs).reshape(y.shape), y, batch.scaled_tensor)
        batch.total = loss + self._penalty()
        return float(batch.total.detach())

    def apply(self, batch: _TorchBatch) -> float:
        batch.total.backward()
        self.optimizer.step()
        return 0.0

    def loss(self, data: TrainData) -> float:
        import torch

        with torch.no_grad():
            xs, y, w = self._tensors(data, slice(None))
            return float(self.loss_fn(self.module(*xs).reshape(y.shape), y, w) + self._penalty())

    def get_weights(self) -> dict[str, np.ndarray]:
        return {n: p.detach().numpy().copy() for n, p in self.module.parameters_by_initializer().items()}

    def set_weights(self, values: dict[str, np.ndarray]) -> None:
        import torch

        params = self.module.parameters_by_initializer()
        for name, value in values.items():
            if tuple(value.shape) != tuple(params[name].shape):
                raise ValueError(f"set_state: {name!r} has shape {tuple(params[name].shape)}, the value has "
                                 f"{value.shape}")
        with torch.no_grad():
            for name, value in values.items():
                params[name].copy_(torch.from_numpy(np.asarray(value)))

    def graphs(self) -> dict:
        return {"model": self.module.get_trained_onnx(), **self.module.training_graphs()}

    def get_optimizer_state(self) -> dict[str, np.ndarray]:
        state, steps = {}, 0
        for name, param in self.module.parameters_by_initializer().items():
            slots = self.optimizer.state.get(param, {})
            steps = slots.get("step", steps)
            state.update({slot_name(slot, name): slots[slot].detach().numpy().copy() for slot in self.rate.slots[1:]
                          if slot in slots})
        state["step"] = np.array(steps, dtype=np.int64)
        return state

    def set_optimizer_state(self, state: dict[str, np.ndarray]) -> None:
        import torch

        steps = int(state.get("step", 0))
        for name, param in self.module.parameters_by_initializer().items():
            if steps:
                self.optimizer.state[param] = {"step": steps, **{
                    slot: torch.from_numpy(np.array(state[slot_name(slot, name)], dtype=np.float32))
                    for slot in self.rate.slots[1:]}}

register("trainer", TorchTrainer)
