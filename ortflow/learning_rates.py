"""Learning rates: the weight update after each batch, as one ONNX graph over every trained weight.

The update graph reads the learning-rate scalars, then for each weight its gradient, its value and its state
tensors (velocity, moments); it writes the new value and state, plus the penalty of the weights it read. At run
time (:meth:`BaseLearningRate.start`) every weight and state tensor has two device buffers used in turn, and the
two IOBindings (read 0 / write 1, read 1 / write 0) are built once: a step binds nothing.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Callable, ClassVar

import numpy as np
import onnx
from sklearn.base import BaseEstimator

from .onnx_builder import DEFAULT_OPSET, GraphBuilder
from .penalties import BaseLearningPenalty, NoLearningPenalty
from .registry import Registered
from .runtime import DeviceBuffer, OnnxFunction
from .schedules import SCHEDULES, learning_rate_at
from ._ort import artifacts, onnxblock
from .validation import (
    check_choice,
    check_device,
    check_finite,
    check_non_negative,
    check_positive_float,
    resolve_device,
)

PENALTY_OUTPUT = "penalty"


def grad_name(weight: str) -> str:
    return f"grad:{weight}"


def slot_name(slot: str, weight: str, new: bool = False) -> str:
    return f"{'new_' if new else ''}{slot}:{weight}"


class BaseLearningRate(Registered, BaseEstimator):
    """A weight update. Subclasses declare ``slots`` (state tensors per weight, ``'weight'`` first) and
    ``scalars`` (names of scalar inputs), and implement :meth:`_update`, :meth:`_scalar_values`, :meth:`value_at`."""

    kind = "learning_rate"
    slots: ClassVar[tuple[str, ...]] = ("weight",)
    scalars: ClassVar[tuple[str, ...]] = ("learning_rate",)
    #: whether the scalars change at every step (else only with the learning rate)
    per_step_scalars: ClassVar[bool] = False

    # --- definition ---
    def value_at(self, samples_seen: int) -> float:
        """The learning rate of the epoch starting after ``samples_seen`` samples."""
        raise NotImplementedError

    def _scalar_values(self, learning_rate: float) -> list[float]:
        """Values of ``scalars`` for the coming step (``step_`` is its 1-based number)."""
        return [learning_rate]

    def _update(self, b: GraphBuilder, grad: str, state: dict[str, str], scalars: dict[str, str]) -> dict[str, str]:
        """Names of the new ``slots`` given the gradient (penalty included), the current ones and the scalars."""
        raise NotImplementedError

    def _initial_slot(self, slot: str, weight: np.ndarray) -> np.ndarray:
        return np.zeros_like(weight, dtype=np.float32)

    def check(self) -> None:
        """Raise ValueError on an invalid hyper-parameter."""

    def ort_optimizer(self) -> Any:
        """The optimizer full training asks onnxruntime's ``generate_artifacts`` for (an ``OptimType`` or an
        ``onnxblock`` optimizer block); the learning rate itself is set per epoch from :meth:`value_at`."""
        raise self._not_in_full_training()

    def step_options(self) -> dict[str, Any]:
        """The arguments of :func:`ortflow.autodiff.training_step` running this update in full training on
        ortflow's own graph (``optimizer`` and its hyper-parameters); the rate itself is fed per epoch."""
        raise self._not_in_full_training()

    def _not_in_full_training(self) -> ValueError:
        return ValueError(
            f"learning_rate={self!r}: full training (OrtGradientOptimizer) has no such optimizer; use "
            "forward-backward training (OrtGradientForwardBackwardOptimizer), which runs any learning rate as "
            "an ONNX graph"
        )

    # --- a schedule that can be stepped outside a fit (onnxcustom's interface) ---
    def init_learning_rate(self) -> BaseLearningRate:
        """Reset the schedule to its first value (:attr:`value`); returns self."""
        self.check()
        self.value = self.value_at(0)
        return self

    def update_learning_rate(self, t: int) -> BaseLearningRate:
        """Move the schedule to ``t`` samples seen (:attr:`value`); returns self."""
        self.value = self.value_at(int(t))
        return self

    def loop(self, n: int = 1000):
        """The first ``n`` values of the schedule, one per sample seen."""
        for t in range(n):
            yield self.value_at(t)

    def build_onnx_function(self, opset: int = DEFAULT_OPSET, device: str = "cpu",
                            shapes: Mapping[str, Sequence[int]] | None = None,
                            penalty: BaseLearningPenalty | None = None,
                            penalized: Collection[str] | None = None) -> onnx.ModelProto:
        """The update graph of the tensors ``shapes`` (name -> shape; default one tensor ``'weight'`` of unknown
        shape). Inputs: ``scalars``, then per tensor ``grad:<w>`` and ``<slot>:<w>``; outputs: ``penalty`` (only
        when the penalty adds something), then per tensor ``new_<slot>:<w>``. ``penalty`` applies to the tensors
        in ``penalized`` (default: those ``penalty.penalizes``). ``device`` does not change the graph."""
        self.check()
        shapes = {"weight": None} if shapes is None else dict(shapes)
        penalty = penalty or NoLearningPenalty()
        penalized = {w for w in shapes if penalty.penalizes(w)} if penalized is None else set(penalized)
        b = GraphBuilder(prefix="update")
        scalars = {name: b.input(name, []) for name in self.scalars}
        values, updates = [], []
        for weight, shape in shapes.items():
            grad = b.input(grad_name(weight), shape)
            state = {slot: b.input(slot_name(slot, weight), shape) for slot in self.slots}
            if weight in penalized:
                value = penalty.add_value(b, state["weight"])
                if value is not None:
                    values.append(value)
                grad = penalty.add_gradient(b, state["weight"], grad)
            updates.append((weight, shape, self._update(b, grad, state, scalars)))
        if values:
            b.output(b.add_all(values), PENALTY_OUTPUT, [])
        for weight, shape, new in updates:
            for slot in self.slots:
                b.output(new[slot], slot_name(slot, weight, new=True), shape)
        return b.model(opset, name=type(self).__name__)

    # --- runtime ---
    def start(self, weights: Mapping[str, np.ndarray], device: str = "cpu",
              penalty: BaseLearningPenalty | None = None, session_options=None, flat: bool | None = None) -> None:
        """Allocate the buffers of ``weights``, their gradients (``grads_``, where the backward pass writes) and
        their state, and bind the update graph to them.

        With ``flat`` (default on CPU) the weights share one contiguous buffer per slot (two groups: penalized
        or not) and each weight is a view of it, so the update graph has a handful of nodes whatever the number
        of weights."""
        self.check()
        penalty = penalty or NoLearningPenalty()
        device = resolve_device(device)
        self.device_, self.step_, self.parity_ = device, 0, 0
        shapes = {name: tuple(np.shape(value)) for name, value in weights.items()}
        flat = check_device(device)[0] == "cpu" if flat is None else flat
        if flat:
            groups: dict[str, list[str]] = {}
            for name in weights:
                groups.setdefault("penalized" if penalty.penalizes(name) else "free", []).append(name)
        else:
            groups = {name: [name] for name in weights}
        penalized = [grp for grp, names in groups.items() if penalty.penalizes(names[0])]
        group_shapes = {}
        self.buffers_: dict[tuple[str, str], list[DeviceBuffer]] = {}
        self.grads_: dict[str, DeviceBuffer] = {}
        group_buffers: dict[tuple[str, str], list[DeviceBuffer]] = {}
        for grp, names in groups.items():
            size = sum(int(np.prod(shapes[n])) for n in names)
            group_shapes[grp] = (size,) if flat else shapes[names[0]]
            for slot in ("grad",) + self.slots:
                pair = [DeviceBuffer(group_shapes[grp], device) for _ in range(2 if slot != "grad" else 1)]
                group_buffers[slot, grp] = pair
                offset = 0
                for name in names:
                    views = [DeviceBuffer.view(b, offset, shapes[name]) if flat else b for b in pair]
                    offset += int(np.prod(shapes[name]))
                    if slot == "grad":
                        self.grads_[name] = views[0]
                        continue
                    self.buffers_[slot, name] = views
                    initial = weights[name] if slot == "weight" else self._initial_slot(slot, np.asarray(weights[name]))
                    views[0].write(np.asarray(initial, dtype=np.float32).reshape(shapes[name]))
        model = self.build_onnx_function(DEFAULT_OPSET, device, group_shapes, penalty, penalized)
        self.function_ = OnnxFunction(model, device, session_options)
        self.scalar_buffers_ = [DeviceBuffer((), device) for _ in self.scalars]
        self._scalars = [None] * len(self.scalars)
        has_penalty = PENALTY_OUTPUT in self.function_.output_names
        self.penalty_buffer_ = DeviceBuffer((), device) if has_penalty else None
        self._bindings = []
        for parity in (0, 1):
            inputs, outputs = list(self.scalar_buffers_), [self.penalty_buffer_] if has_penalty else []
            for grp in groups:
                inputs.append(group_buffers["grad", grp][0])
                inputs.extend(group_buffers[slot, grp][parity] for slot in self.slots)
                outputs.extend(group_buffers[slot, grp][1 - parity] for slot in self.slots)
            self._bindings.append(self.function_.bind(inputs, outputs))
        self._group_buffers = group_buffers

    def step(self, learning_rate: float) -> None:
        """Update every weight from the gradients in the bound buffers."""
        self.stepper(learning_rate)()

    def stepper(self, learning_rate: float) -> Callable[[], None]:
        """A function running one update at ``learning_rate`` (the trainer's hot loop calls it once per batch)."""
        run, bindings = self.function_._sess.run_with_iobinding, self._bindings
        per_step = self.per_step_scalars
        if not per_step:
            self._write_scalars(learning_rate)

        def step() -> None:
            self.step_ += 1
            if per_step:
                self._write_scalars(learning_rate)
            run(bindings[self.parity_], None)
            self.parity_ ^= 1

        return step

    def _write_scalars(self, learning_rate: float) -> None:
        values = self._scalar_values(learning_rate)
        if values != self._scalars:
            for buffer, value in zip(self.scalar_buffers_, values):
                buffer.write(value)
            self._scalars = values

    def penalty_value(self) -> float:
        """Penalty of the weights read by the last step (0 without penalty)."""
        return 0.0 if self.penalty_buffer_ is None else self.penalty_buffer_.scalar()

    def current(self, slot: str = "weight") -> dict[str, DeviceBuffer]:
        """The buffers holding the current value of ``slot`` for every weight."""
        return {name: pair[self.parity_] for (s, name), pair in self.buffers_.items() if s == slot}

    def get_weights(self) -> dict[str, np.ndarray]:
        return {name: buf.read() for name, buf in self.current().items()}

    def set_weights(self, values: Mapping[str, Any]) -> None:
        current = self.current()
        for name, value in values.items():
            current[name].write(np.asarray(value, dtype=np.float32).reshape(current[name].shape))

    def get_state(self) -> dict[str, np.ndarray]:
        """Optimizer state as numpy: ``<slot>:<weight>`` for every slot but the weight, and ``step``."""
        state = {slot_name(slot, name): pair[self.parity_].read()
                 for (slot, name), pair in self.buffers_.items() if slot != "weight"}
        state["step"] = np.array(self.step_, dtype=np.int64)
        return state

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore what :meth:`get_state` returned."""
        for (slot, name), pair in self.buffers_.items():
            if slot != "weight":
                key = slot_name(slot, name)
                if key not in state:
                    raise KeyError(f"set_state: the optimizer state has no {key!r}; keys: {sorted(state)}")
                pair[self.parity_].write(np.asarray(state[key], dtype=np.float32))
        self.step_ = int(state.get("step", 0))

    def __getstate__(self):
        state = super().__getstate__()
        for key in ("function_", "buffers_", "grads_", "scalar_buffers_", "penalty_buffer_", "_bindings",
                    "_group_buffers"):
            state.pop(key, None)
        return state


def _check_schedule(rate: BaseLearningRate) -> None:
    check_choice("learning_rate", rate.learning_rate, SCHEDULES)
    check_positive_float("eta0", rate.eta0)
    check_positive_float("alpha", rate.alpha)
    check_finite("power_t", rate.power_t)


class LearningRateSGD(BaseLearningRate):
    """``w -= lr * grad``, ``lr`` following scikit-learn's schedules per epoch (see
    :func:`ortflow.schedules.learning_rate_at`): ``'constant'`` (``eta0``), ``'invscaling'``
    (``eta0 / (samples_seen + 1) ** power_t``), ``'optimal'`` (``1 / (alpha * (t0 + samples_seen))``)."""

    names = ("sgd", "SGD")

    def __init__(self, eta0: float = 0.01, alpha: float = 0.0001, power_t: float = 0.25,
                 learning_rate: str = "invscaling"):
        self.eta0 = eta0
        self.alpha = alpha
        self.power_t = power_t
        self.learning_rate = learning_rate

    def check(self) -> None:
        _check_schedule(self)

    def value_at(self, samples_seen: int) -> float:
        return learning_rate_at(self.learning_rate, float(self.eta0), samples_seen, self.power_t, self.alpha)

    def ort_optimizer(self):
        return artifacts.OptimType.SGD

    def step_options(self) -> dict[str, Any]:
        return {"optimizer": "sgd"}

    def _update(self, b, grad, state, scalars):
        return {"weight": b.node("Sub", [state["weight"], b.node("Mul", [grad, scalars["learning_rate"]])])}


class LearningRateSGDNesterov(LearningRateSGD):
    """scikit-learn MLP's ``SGDOptimizer``: ``v = momentum * v - lr * grad``, then ``w += momentum * v - lr * grad``
    (``nesterov=True``) or ``w += v``; ``lr`` follows the same schedules as :class:`LearningRateSGD`.
    Forward-backward training only: onnxruntime's training API has no momentum optimizer."""

    names = ("nesterov", "SGDNesterov")
    slots = ("weight", "velocity")

    def __init__(self, eta0: float = 0.01, alpha: float = 0.0001, power_t: float = 0.25,
                 learning_rate: str = "invscaling", momentum: float = 0.9, nesterov: bool = True):
        super().__init__(eta0=eta0, alpha=alpha, power_t=power_t, learning_rate=learning_rate)
        self.momentum = momentum
        self.nesterov = nesterov

    def check(self) -> None:
        super().check()
        if not 0.0 <= self.momentum <= 1.0:
            raise ValueError(f"momentum={self.momentum!r} must be in [0, 1]")

    def ort_optimizer(self):
        return BaseLearningRate.ort_optimizer(self)

    def step_options(self) -> dict[str, Any]:
        return BaseLearningRate.step_options(self)

    def _update(self, b, grad, state, scalars):
        step = b.node("Mul", [grad, scalars["learning_rate"]])
        momentum = b.const(self.momentum)
        velocity = b.node("Sub", [b.node("Mul", [state["velocity"], momentum]), step])
        update = b.node("Sub", [b.node("Mul", [velocity, momentum]), step]) if self.nesterov else velocity
        return {"weight": b.node("Add", [state["weight"], update]), "velocity": velocity}


class LearningRateAdam(BaseLearningRate):
    """scikit-learn MLP's ``AdamOptimizer``: at step ``t``, ``m = beta1 * m + (1 - beta1) * grad``,
    ``v = beta2 * v + (1 - beta2) * grad ** 2``, ``w -= lr_t * m / (sqrt(v) + epsilon)`` with
    ``lr_t = eta0 * sqrt(1 - beta2 ** t) / (1 - beta1 ** t)``. Full training runs onnxruntime's AdamW without
    decay, where epsilon enters after the bias correction of ``v``: the two trainers differ by that much."""

    names = ("adam", "Adam")
    slots = ("weight", "m", "v")
    per_step_scalars = True

    def __init__(self, eta0: float = 0.001, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8):
        self.eta0 = eta0
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon

    def check(self) -> None:
        check_positive_float("eta0", self.eta0)
        check_positive_float("epsilon", self.epsilon)
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be in [0, 1)")

    def value_at(self, samples_seen: int) -> float:
        return float(self.eta0)

    def ort_optimizer(self):
        return onnxblock.optim.AdamW(betas=(float(self.beta1), float(self.beta2)), eps=float(self.epsilon),
                                     weight_decay=float(getattr(self, "weight_decay", 0.0)))

    def step_options(self) -> dict[str, Any]:
        decay = float(getattr(self, "weight_decay", 0.0))
        options = {"optimizer": "adamw" if decay else "adam", "betas": (float(self.beta1), float(self.beta2)),
                   "epsilon": float(self.epsilon)}
        return {**options, "weight_decay": decay} if decay else options

    def _scalar_values(self, learning_rate: float) -> list[float]:
        t = self.step_
        return [float(self.eta0) * math.sqrt(1.0 - self.beta2**t) / (1.0 - self.beta1**t)]

    def _update(self, b, grad, state, scalars):
        beta1, beta2 = float(self.beta1), float(self.beta2)
        m = b.node("Add", [b.node("Mul", [state["m"], b.const(beta1)]), b.node("Mul", [grad, b.const(1 - beta1)])])
        square = b.node("Mul", [grad, grad])
        v = b.node("Add", [b.node("Mul", [state["v"], b.const(beta2)]), b.node("Mul", [square, b.const(1 - beta2)])])
        denominator = b.node("Add", [b.node("Sqrt", [v]), b.const(self.epsilon)])
        step = b.node("Mul", [b.node("Div", [m, denominator]), scalars["learning_rate"]])
        return {"weight": b.node("Sub", [state["weight"], step]), "m": m, "v": v}


class LearningRateAdamW(LearningRateAdam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): each step first shrinks the weights,
    ``w -= eta0 * weight_decay * w``, then applies :class:`LearningRateAdam`'s update."""

    names = ("adamw", "AdamW")

    def __init__(self, eta0: float = 0.001, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(eta0=eta0, beta1=beta1, beta2=beta2, epsilon=epsilon)
        self.weight_decay = weight_decay

    def check(self) -> None:
        super().check()
        check_non_negative("weight_decay", self.weight_decay)

    def _update(self, b, grad, state, scalars):
        shrink = b.const(1.0 - float(self.eta0) * float(self.weight_decay))
        decayed = dict(state, weight=b.node("Mul", [state["weight"], shrink]))
        return super()._update(b, grad, decayed, scalars)
