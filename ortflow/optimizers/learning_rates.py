"""Optimizers (the classes keep onnxcustom's name, learning rates): each update rule is written once.

A class declares ``slots`` (the state tensors of each weight, ``'weight'`` first) and writes its rule once, in
:meth:`~BaseLearningRate._update` (and the step-wide scalars in :meth:`~BaseLearningRate._derived`), against a small
arithmetic interface ``ops`` (``add``, ``sub``, ``mul``, ``div``, ``sqrt``, ``pow``, ``const``). Every face of the
optimizer comes from that one definition:

- forward-backward training's update graph (:meth:`BaseLearningRate.build_onnx_function`), ``ops`` writing ONNX
  nodes (:class:`GraphOps`);
- full training's step graph (:func:`ortflow.autodiff.training_step`), the same rule written into the step graph;
- a ``torch.optim.Optimizer`` (:class:`ortflow.torch.RuleOptimizer`), ``ops`` on torch tensors
  (:class:`ArrayOps`); numpy arrays go through the same ops (:meth:`BaseLearningRate.reference_step`, the tests'
  reference).

The rule reads two scalars fed at every step: ``learning_rate`` (the schedule's value for the epoch,
:meth:`~BaseLearningRate.value_at`) and ``step`` (the 1-based number of the update). onnxruntime-training's own
optimizers (``gradients='onnxruntime'``) are onnxruntime's rules, not ours: :meth:`~BaseLearningRate.ort_optimizer`
maps a class to the one onnxruntime has, where it has one.

At run time forward-backward training runs the update graph in an :class:`UpdateRuntime`: every weight and state
tensor has two device buffers used in turn, and the two IOBindings (read 0 / write 1, read 1 / write 0) are built
once: a step binds nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Callable, ClassVar

import numpy as np
import onnx
from onnx import TensorProto

from ..graph.builder import DEFAULT_OPSET, GraphBuilder
from ..objectives.penalties import BaseLearningPenalty, NoLearningPenalty
from ..runtime.placement import Placement
from ..registry import Parametrized, Registered
from ..runtime.sessions import DeviceBuffer, OnnxFunction
from .schedules import SCHEDULES, learning_rate_at
from .._ort import artifacts, onnxblock
from ..runtime.validation import check_choice, check_finite, check_non_negative, check_positive_float

PENALTY_OUTPUT = "penalty"
#: the settings that give the schedule's value only (fed at every epoch), never the graphs
VALUE_PARAMS = ("eta0", "learning_rate", "power_t", "alpha")
#: the scalars every update rule reads, fed at every step: the schedule's rate and the 1-based step number
LEARNING_RATE = "learning_rate"
STEP = "step"


class GraphOps:
    """The arithmetic of the update rules as ONNX nodes, through ortflow's node writer
    (:class:`~ortflow.graph.builder.Emitter`: a step graph's, or the update graph's :class:`GraphBuilder`)."""

    def __init__(self, writer):
        self._node = writer.op
        self.const = lambda value: writer.const(value, dtype=TensorProto.FLOAT)

    def add(self, a, b):
        return self._node("Add", [a, b])

    def sub(self, a, b):
        return self._node("Sub", [a, b])

    def mul(self, a, b):
        return self._node("Mul", [a, b])

    def div(self, a, b):
        return self._node("Div", [a, b])

    def sqrt(self, a):
        return self._node("Sqrt", [a])

    def pow(self, a, b):
        return self._node("Pow", [a, b])


class ArrayOps:
    """The same arithmetic on numpy arrays or torch tensors, scalars in ``dtype`` (float32 mirrors the graphs'
    roundings: the torch optimizer; float64: the numpy reference)."""

    def __init__(self, dtype=np.float32):
        self.dtype = np.dtype(dtype).type

    add, sub, mul, div, pow = (staticmethod(f) for f in (
        lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / b, lambda a, b: a ** b))

    @staticmethod
    def sqrt(a):
        return a.sqrt() if hasattr(a, "sqrt") else np.sqrt(a)  # a torch tensor, else numpy

    def const(self, value: float):
        return self.dtype(value)


def grad_name(weight: str) -> str:
    return f"grad:{weight}"


def slot_name(slot: str, weight: str, new: bool = False) -> str:
    """The key of ``weight``'s ``slot`` in the trainers' public optimizer state (``get_optimizer_state``) and in
    the update graph: ``<slot>:<weight>``."""
    return f"{'new_' if new else ''}{slot}:{weight}"


def state_tensor(weight: str, slot: str) -> str:
    """The name of ``weight``'s ``slot`` as a state tensor: in the step graph (:func:`ortflow.autodiff.training_step`),
    a training package's state and :class:`ortflow.trainers.problem.TrainingProblem`'s state table: ``<weight>_<slot>``."""
    return f"{weight}_{slot}"


class BaseLearningRate(Registered, Parametrized):
    """An optimizer: a schedule (:meth:`value_at`) and an update rule written once (:meth:`_derived`,
    :meth:`_update`; see the module's docstring). Subclasses declare ``slots`` (state tensors per weight,
    ``'weight'`` first)."""

    kind = "optimizer"
    slots: ClassVar[tuple[str, ...]] = ("weight",)
    #: the scalars fed at every step (the update graph's and the step graph's scalar inputs)
    scalars: ClassVar[tuple[str, ...]] = (LEARNING_RATE, STEP)
    #: whether the rule reads ``step`` (else the scalars change only with the learning rate)
    per_step_scalars: ClassVar[bool] = False
    #: the update is ``w - learning_rate * grad``: full training may seed its backward pass with the rate
    plain_step: ClassVar[bool] = False

    # --- definition ---
    def value_at(self, samples_seen: int) -> float:
        """The learning rate of the epoch starting after ``samples_seen`` samples."""
        raise NotImplementedError

    def _derived(self, ops, learning_rate, step) -> dict:
        """Values the rule computes once per step from the scalars, for every weight (default: the rate itself)."""
        return {LEARNING_RATE: learning_rate}

    def _update(self, ops, weight, grad, state: dict, derived: dict) -> dict:
        """The new value of every slot (``'weight'`` included) from the weight, its gradient (penalty included),
        its state (slot -> value, ``'weight'`` excluded) and :meth:`_derived`'s values: the one definition of the
        rule, in ``ops``' arithmetic."""
        raise NotImplementedError

    def _initial_slot(self, slot: str, weight: np.ndarray) -> np.ndarray:
        return np.zeros_like(weight, dtype=np.float32)

    def initial_slot(self, slot: str, weight: np.ndarray) -> np.ndarray:
        """The value of ``weight``'s ``slot`` before the first step (a subclass overrides ``_initial_slot``)."""
        return self._initial_slot(slot, weight)

    def write_update(self, ops, weights: Mapping[str, tuple], learning_rate, step) -> dict[str, dict]:
        """The rule applied to ``weights`` (name -> (value, gradient, state)) in ``ops``: name -> new slots."""
        derived = self._derived(ops, learning_rate, step)
        return {name: self._update(ops, value, grad, state, derived) for name, (value, grad, state) in weights.items()}

    def reference_step(self, weights: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray],
                       state: Mapping[str, np.ndarray], learning_rate: float, step: int) -> dict[str, np.ndarray]:
        """One update in numpy (float64), the rule's reference: ``state`` maps ``'<slot>:<weight>'`` to its value
        (zeros when absent); returns the new weights and state with the same keys."""
        given = {name: (np.asarray(w, np.float64), np.asarray(grads[name], np.float64),
                        {slot: np.asarray(state.get(slot_name(slot, name), np.zeros(np.shape(w))), np.float64)
                         for slot in self.slots[1:]}) for name, w in weights.items()}
        new = self.write_update(ArrayOps(np.float64), given, np.float64(learning_rate), np.float64(step))
        out = {name: slots["weight"] for name, slots in new.items()}
        out.update({slot_name(slot, name): slots[slot] for name, slots in new.items() for slot in self.slots[1:]})
        return out

    def ort_optimizer(self) -> Any:
        """The optimizer full training asks onnxruntime's ``generate_artifacts`` for (an ``OptimType`` or an
        ``onnxblock`` optimizer block); the learning rate itself is set per epoch from :meth:`value_at`."""
        raise self._not_in_full_training()

    def graph_key(self) -> tuple:
        """What of this optimizer its graphs are built from (its class and the settings written into them), not
        the ones that only give the rate's value, fed at every epoch: graphs built for one key serve the other
        values (a GridSearchCV over ``eta0`` reuses them)."""
        return (type(self).__name__, sorted((k, v) for k, v in self.get_params().items() if k not in VALUE_PARAMS))

    def _not_in_full_training(self) -> ValueError:
        return ValueError(
            f"learning_rate={self!r}: onnxruntime-training's artifacts (gradients='onnxruntime') have no such "
            "optimizer; use ortflow's own graphs (gradients='ortflow'), which run every optimizer"
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
        values, given = [], {}
        for weight, shape in shapes.items():
            grad = b.input(grad_name(weight), shape)
            state = {slot: b.input(slot_name(slot, weight), shape) for slot in self.slots}
            if weight in penalized:
                value = penalty.add_value(b, state["weight"])
                if value is not None:
                    values.append(value)
                grad = penalty.add_gradient(b, state["weight"], grad)
            given[weight] = (state["weight"], grad, {k: v for k, v in state.items() if k != "weight"})
        updates = self.write_update(GraphOps(b), given, scalars[LEARNING_RATE], scalars[STEP])
        if values:
            b.output(b.add_all(values), PENALTY_OUTPUT, [])
        for weight, shape in shapes.items():
            for slot in self.slots:
                b.output(updates[weight][slot], slot_name(slot, weight, new=True), shape)
        return b.model(opset, name=type(self).__name__)

    # --- runtime (forward-backward training's update buffers: an UpdateRuntime, see start) ---
    def start(self, weights: Mapping[str, np.ndarray], device: str = "cpu",
              penalty: BaseLearningPenalty | None = None, session_options=None, flat: bool | None = None
              ) -> UpdateRuntime:
        """Start an :class:`UpdateRuntime` of this rule on ``weights`` (kept as ``runtime_``; the methods and
        attributes below read it: ``buffers_``, ``grads_``, ``parity_``...). A trainer holds its own
        :class:`UpdateRuntime` instead: the optimizer object carries no buffers while it trains."""
        self.runtime_ = UpdateRuntime(self, weights, device, penalty, session_options, flat)
        return self.runtime_

    def __getattr__(self, name: str):
        if name in _RUNTIME_ATTRIBUTES and "runtime_" in self.__dict__:
            return getattr(self.__dict__["runtime_"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def step(self, learning_rate: float) -> None:
        """Update every weight from the gradients in the bound buffers (of :meth:`start`'s runtime)."""
        self.runtime_.step(learning_rate)

    def stepper(self, learning_rate: float) -> Callable[[], None]:
        return self.runtime_.stepper(learning_rate)

    def penalty_value(self) -> float:
        return self.runtime_.penalty_value()

    def current(self, slot: str = "weight") -> dict[str, DeviceBuffer]:
        return self.runtime_.current(slot)

    def get_weights(self) -> dict[str, np.ndarray]:
        return self.runtime_.get_weights()

    def set_weights(self, values: Mapping[str, Any]) -> None:
        self.runtime_.set_weights(values)

    def get_state(self) -> dict[str, np.ndarray]:
        return self.runtime_.get_state()

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        self.runtime_.set_state(state)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("runtime_", None)
        return state


#: what :meth:`BaseLearningRate.start`'s runtime exposes through the rate (earlier, the rate's own attributes)
_RUNTIME_ATTRIBUTES = frozenset({"buffers_", "grads_", "parity_", "step_", "device_", "function_", "scalar_buffers_",
                                 "penalty_buffer_"})


class UpdateRuntime:
    """Forward-backward training's update: the rule of ``rate`` in its update graph
    (:meth:`BaseLearningRate.build_onnx_function`) bound to the buffers of ``weights``, their gradients
    (``grads_``, where the backward pass writes) and their state.

    Every weight and state tensor has two device buffers used in turn, and the two IOBindings (read 0 / write 1,
    read 1 / write 0) are built once: a step binds nothing. With ``flat`` (default on CPU) the weights share one
    contiguous buffer per slot (two groups: penalized or not) and each weight is a view of it, so the update graph
    has a handful of nodes whatever the number of weights."""

    def __init__(self, rate: BaseLearningRate, weights: Mapping[str, np.ndarray], device: str = "cpu",
                 penalty: BaseLearningPenalty | None = None, session_options=None, flat: bool | None = None):
        rate.check()
        self.rate = rate
        self.slots, self.scalars, self.per_step_scalars = rate.slots, rate.scalars, rate.per_step_scalars
        penalty = penalty or NoLearningPenalty()
        placement = Placement.of(device)
        device = placement.device
        self.device_, self.step_, self.parity_ = device, 0, 0
        shapes = {name: tuple(np.shape(value)) for name, value in weights.items()}
        flat = placement.kind == "cpu" if flat is None else flat
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
                    initial = weights[name] if slot == "weight" else rate.initial_slot(slot, np.asarray(weights[name]))
                    views[0].write(np.asarray(initial, dtype=np.float32).reshape(shapes[name]))
        model = rate.build_onnx_function(DEFAULT_OPSET, device, group_shapes, penalty, penalized)
        self.function_ = OnnxFunction(model, placement, session_options)
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
        run, bindings = self.function_.run_with_iobinding, self._bindings
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
        values = [float(learning_rate), float(self.step_)]
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


def _check_schedule(rate: BaseLearningRate) -> None:
    check_choice("learning_rate", rate.schedule, SCHEDULES)
    check_positive_float("eta0", rate.eta0)
    check_positive_float("alpha", rate.alpha)
    check_finite("power_t", rate.power_t)


class LearningRateSGD(BaseLearningRate):
    """``w -= lr * grad``, ``lr`` following scikit-learn's schedules per epoch (see
    :func:`ortflow.optimizers.schedules.learning_rate_at`): ``'constant'`` (``eta0``), ``'invscaling'``
    (``eta0 / (samples_seen + 1) ** power_t``), ``'optimal'`` (onnxcustom's: ``eta0 * t0 / (t0 + samples_seen)``),
    ``'optimal_sklearn'`` (scikit-learn's: ``1 / (alpha * (t0 + samples_seen))``).
    ``learning_rate`` names the schedule: onnxcustom's spelling, kept."""

    names = ("sgd", "SGD")
    plain_step = True

    def __init__(self, eta0: float = 0.01, alpha: float = 0.0001, power_t: float = 0.25,
                 learning_rate: str = "invscaling"):
        self.eta0 = eta0
        self.alpha = alpha
        self.power_t = power_t
        self.learning_rate = learning_rate

    @property
    def schedule(self) -> str:
        """The schedule's name: ``learning_rate`` is onnxcustom's name for it in the constructor, kept there only."""
        return self.learning_rate

    def check(self) -> None:
        _check_schedule(self)

    def value_at(self, samples_seen: int) -> float:
        return learning_rate_at(self.schedule, float(self.eta0), samples_seen, self.power_t, self.alpha)

    def ort_optimizer(self):
        return artifacts.OptimType.SGD

    def _update(self, ops, weight, grad, state, derived):
        return {"weight": ops.sub(weight, ops.mul(grad, derived[LEARNING_RATE]))}


class LearningRateSGDNesterov(LearningRateSGD):
    """scikit-learn MLP's ``SGDOptimizer``: ``v = momentum * v - lr * grad``, then ``w += momentum * v - lr * grad``
    (``nesterov=True``) or ``w += v``; ``lr`` follows the same schedules as :class:`LearningRateSGD`.
    onnxruntime-training's artifacts have no momentum optimizer: ortflow's own graphs run it."""

    names = ("nesterov", "SGDNesterov")
    slots = ("weight", "velocity")
    plain_step = False

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

    def _update(self, ops, weight, grad, state, derived):
        step = ops.mul(grad, derived[LEARNING_RATE])
        momentum = ops.const(float(self.momentum))
        velocity = ops.sub(ops.mul(state["velocity"], momentum), step)
        update = ops.sub(ops.mul(velocity, momentum), step) if self.nesterov else velocity
        return {"weight": ops.add(weight, update), "velocity": velocity}


class LearningRateAdam(BaseLearningRate):
    """scikit-learn MLP's ``AdamOptimizer``: at step ``t``, ``m = beta1 * m + (1 - beta1) * grad``,
    ``v = beta2 * v + (1 - beta2) * grad ** 2``, ``w -= lr_t * m / (sqrt(v) + epsilon)`` with
    ``lr_t = lr * sqrt(1 - beta2 ** t) / (1 - beta1 ** t)``, ``lr`` the rate fed (the trainers feed ``eta0``, its
    schedule being constant; a torch LR scheduler may change it). onnxruntime-training's artifacts
    (``gradients='onnxruntime'``) run onnxruntime's AdamW instead, where epsilon is added after the bias correction
    of ``sqrt(v)``: with the default epsilon the two differ by less than float32 rounding on most steps."""

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

    def _derived(self, ops, learning_rate, step):
        one = ops.const(1.0)
        bias1 = ops.sub(one, ops.pow(ops.const(float(self.beta1)), step))
        bias2 = ops.sub(one, ops.pow(ops.const(float(self.beta2)), step))
        return {LEARNING_RATE: learning_rate,
                "step_size": ops.div(ops.mul(learning_rate, ops.sqrt(bias2)), bias1)}

    def _update(self, ops, weight, grad, state, derived):
        beta1, beta2 = float(self.beta1), float(self.beta2)
        m = ops.add(ops.mul(state["m"], ops.const(beta1)), ops.mul(grad, ops.const(1.0 - beta1)))
        v = ops.add(ops.mul(state["v"], ops.const(beta2)), ops.mul(ops.mul(grad, grad), ops.const(1.0 - beta2)))
        denominator = ops.add(ops.sqrt(v), ops.const(float(self.epsilon)))
        moved = ops.sub(weight, ops.mul(derived["step_size"], ops.div(m, denominator)))
        return {"weight": self._decayed(ops, moved, derived), "m": m, "v": v}

    def _decayed(self, ops, moved, derived):
        return moved


class LearningRateAdamW(LearningRateAdam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): after :class:`LearningRateAdam`'s step ``w'``,
    ``w = w' - lr * weight_decay * w'`` (onnxruntime-training's AdamW in its default mode, so that both of full
    training's graphs, ortflow's and onnxruntime's, agree)."""

    names = ("adamw", "AdamW")

    def __init__(self, eta0: float = 0.001, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(eta0=eta0, beta1=beta1, beta2=beta2, epsilon=epsilon)
        self.weight_decay = weight_decay

    def check(self) -> None:
        super().check()
        check_non_negative("weight_decay", self.weight_decay)

    def _decayed(self, ops, moved, derived):
        decay = ops.mul(derived[LEARNING_RATE], ops.const(float(self.weight_decay)))
        return ops.sub(moved, ops.mul(moved, decay))



class LearningRateRMSProp(BaseLearningRate):
    """RMSProp (Hinton; ``torch.optim.RMSprop`` without momentum): ``s = rho * s + (1 - rho) * grad ** 2``, then
    ``w -= lr * grad / (sqrt(s) + epsilon)`` with ``lr = eta0``."""

    names = ("rmsprop", "RMSProp")
    slots = ("weight", "square")

    def __init__(self, eta0: float = 0.01, rho: float = 0.99, epsilon: float = 1e-8):
        self.eta0 = eta0
        self.rho = rho
        self.epsilon = epsilon

    def check(self) -> None:
        check_positive_float("eta0", self.eta0)
        check_positive_float("epsilon", self.epsilon)
        if not 0.0 <= self.rho < 1.0:
            raise ValueError(f"rho={self.rho!r} must be in [0, 1)")

    def value_at(self, samples_seen: int) -> float:
        return float(self.eta0)

    def _update(self, ops, weight, grad, state, derived):
        rho = float(self.rho)
        square = ops.add(ops.mul(state["square"], ops.const(rho)), ops.mul(ops.mul(grad, grad), ops.const(1.0 - rho)))
        step = ops.div(ops.mul(grad, derived[LEARNING_RATE]), ops.add(ops.sqrt(square), ops.const(float(self.epsilon))))
        return {"weight": ops.sub(weight, step), "square": square}


class LearningRateAdagrad(BaseLearningRate):
    """Adagrad (Duchi et al.; ``torch.optim.Adagrad`` without decay): ``s = s + grad ** 2``, then
    ``w -= lr * grad / (sqrt(s) + epsilon)`` with ``lr = eta0``, ``s`` starting at 0."""

    names = ("adagrad", "Adagrad")
    slots = ("weight", "sum")

    def __init__(self, eta0: float = 0.01, epsilon: float = 1e-10):
        self.eta0 = eta0
        self.epsilon = epsilon

    def check(self) -> None:
        check_positive_float("eta0", self.eta0)
        check_positive_float("epsilon", self.epsilon)

    def value_at(self, samples_seen: int) -> float:
        return float(self.eta0)

    def _update(self, ops, weight, grad, state, derived):
        total = ops.add(state["sum"], ops.mul(grad, grad))
        step = ops.div(ops.mul(grad, derived[LEARNING_RATE]), ops.add(ops.sqrt(total), ops.const(float(self.epsilon))))
        return {"weight": ops.sub(weight, step), "sum": total}
