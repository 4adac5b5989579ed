"""Full training on ortflow's own graph: one standard-ONNX graph per step (:func:`ortflow.autodiff.training_step`:
loss, gradients and the SGD/Adam/AdamW update) run by any onnxruntime, the plain build included.

Each batch size met (the batch size, and the shorter last batch) runs a step graph built for that many rows, whose
shape computations are constants (fewer nodes per step than the graph with a symbolic batch axis); all of them read
and write the same state. The weights and optimizer moments live in two sets of device buffers, read from one and
written to the other by two IO bindings used in turn; each batch size has its session, its batch buffers and its
two bindings, built once, so a batch copies its rows into the batch buffers and binds nothing. A step whose loss is not
finite is not applied (:meth:`StepGraphRuntime.apply`): the state stays the one read (the buffers it wrote are the
next step's outputs).

With the data on the device (:meth:`StepGraphRuntime.device_pass` over a :class:`~ortflow.runtime.device_data.DeviceRows`,
run by the trainer's one batch loop), a batch's feeds are bound by address into the rows already there, its step
number read from a device vector written once per pass, and its loss written into a
:class:`~ortflow.runtime.device_data.DeviceLosses` read once when the pass ends: every step runs and is applied, and a
non-finite loss found then rolls the state back to the pass's start (a device copy kept) and the loop replays the
steps before it, leaving the state the host loop leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..graph import editing as g
from ..runtime.artifact_cache import STEP_GRAPHS
from ..autodiff import training_step
from ..autodiff.training import LEARNING_RATE, STEP, UPDATED
from ..runtime.device_data import DeviceLosses, DeviceRows, DeviceScalars
from ..data.graph_spec import TrainData
from ..optimizers.learning_rates import BaseLearningRate, slot_name, state_tensor
from ..runtime.placement import Placement
from ..runtime.sessions import DeviceBuffer, OnnxFunction, SessionOptions
from .training_runtime import DevicePass, LossGraphFeeds, TrainingRuntime

@dataclass
class StepBatch:
    """What a batch size has, built once: its feed buffers (``inputs``, in feed order), the session's run and its
    two bindings; ``rows`` is the batch's row selection, set by the trainer's loop."""

    inputs: list[DeviceBuffer]
    run: Callable
    bindings: list
    rows: object = None


class StepGraphRuntime(LossGraphFeeds, TrainingRuntime):
    """Runs :func:`~ortflow.autodiff.training_step` graphs of ``loss_graph`` (a scalar output ``loss_name``, its
    label input ``label``, its sample weight input ``weight``) training ``weights`` with the optimizer ``rate`` (its
    update rule written into the step graph): a :class:`~ortflow.engines.training_runtime.TrainingRuntime`."""

    def __init__(self, loss_graph: onnx.ModelProto, loss_name: str, weights: Sequence[str], rate: BaseLearningRate,
                 placement: Placement | str, options: SessionOptions, label: str | None = None,
                 weight: str | None = None):
        self.placement = Placement.of(placement)
        self.device = device = self.placement.device
        self.label_name, self.weight_name = label, weight
        self.declare_label(loss_graph)
        self.weights = list(weights)
        self._build = dict(loss_model=loss_graph, weights=self.weights, loss_output=loss_name, optimizer=rate)
        self._options = options
        # what the graphs are built from, hashed once: the same graph fitted again reuses them and their sessions
        self._key = STEP_GRAPHS.key(loss_graph.SerializeToString(), self.weights, loss_name, rate.graph_key(),
                                    device, self.placement.precision, options.intra_op_num_threads)
        # the graph with a symbolic batch axis: what is saved, and the names every batch shape's graph shares
        self.step_model = self._cached(None)[0]
        self.input_names = [i.name for i in self.step_model.graph.input]
        self.loss_name = loss_name
        self.state_names = [o.name[: -len(UPDATED)] for o in self.step_model.graph.output[1:]]
        scalars = (LEARNING_RATE, STEP)
        self.feed_names = [n for n in self.input_names if n not in self.state_names and n not in scalars]
        inits = g.get_initializers(loss_graph)
        # a state tensor of the step graph (``<weight>_<slot>``) -> its weight, and its key in the optimizer state
        owners = {state_tensor(w, slot): w for w in self.weights for slot in rate.slots[1:]}
        self._slot_keys = {state_tensor(w, slot): slot_name(slot, w) for w in self.weights for slot in rate.slots[1:]}
        self._state = {}
        for name in self.state_names:
            start = inits[name] if name in inits else np.zeros(inits[owners[name]].shape, dtype=np.float32)
            self._state[name] = [DeviceBuffer(start.shape, device, start), DeviceBuffer(start.shape, device)]
        self._scalars = {n: DeviceBuffer((), device) for n in scalars if n in self.input_names}
        self._loss = DeviceBuffer((), device)
        self._step_number = self._scalars.get(STEP)
        self.parity = 0
        self.steps = 0
        self._rate = None
        self._on_device: _DeviceState | None = None  # passes over device rows (device_pass), built on first use
        eval_graph = g.keep_outputs(g.initializers_as_inputs(loss_graph, self.weights), [loss_name])
        self.eval_function = OnnxFunction(eval_graph, self.placement, options)

    # --- training ---
    def new_batch(self, n: int, arrays: Sequence[np.ndarray]) -> StepBatch:
        """The feed buffers, session run and two bindings (state read from parity 0 or 1) of batches of ``n`` rows
        of ``arrays`` (one per feed, in :attr:`feed_names` order: their row shapes and dtypes)."""
        function = self._cached(n)[1]
        if function.input_names != self.input_names:  # pragma: no cover - the same graph, rows fixed
            raise RuntimeError(f"the step graph for {n} rows has inputs {function.input_names}, not {self.input_names}")
        feeds = {name: DeviceBuffer((n, *a.shape[1:]), self.device, dtype=a.dtype)
                 for name, a in zip(self.feed_names, arrays)}
        bindings = []
        for parity in (0, 1):
            values = {**feeds, **{name: pair[parity] for name, pair in self._state.items()}, **self._scalars}
            outputs = [self._loss] + [self._state[name][1 - parity] for name in self.state_names]
            bindings.append(function.bind([values[name] for name in self.input_names], outputs))
        return StepBatch([feeds[name] for name in self.feed_names], function.run_with_iobinding, bindings)

    def _cached(self, rows: int | None) -> tuple:
        """(step graph, its OnnxFunction) for batches of ``rows`` rows, (symbolic graph, None) for None; built
        once per process for a given graph and settings (:data:`~ortflow.runtime.artifact_cache.STEP_GRAPHS`)."""
        key = f"{self._key}/{rows}"
        entry = STEP_GRAPHS.get(key)
        if entry is None:
            model = training_step(**self._build, batch_rows=rows)
            entry = (model, None if rows is None else OnnxFunction(model, self.placement, self._options))
            STEP_GRAPHS.put(key, entry)
        return entry

    # --- training on data kept on the device ---
    def device_pass(self, rows: DeviceRows, count: int) -> DevicePass:
        """A pass of ``count`` steps over ``rows`` (in their current order), which the trainer's batch loop runs
        (:class:`~ortflow.engines.training_runtime.DevicePass`): each batch's feeds bound by address, every step applied,
        the losses read once at the end; a non-finite one rolls the state back to the pass's start."""
        return _StepPass(self, rows, count)

    def _device_batch(self, n: int) -> StepBatch:
        """The session run and two bindings of batches of ``n`` rows whose feeds, loss and step number are bound
        per step (state and learning rate bound here)."""
        function = self._cached(n)[1]
        bindings = []
        for parity in (0, 1):
            inputs = {**{name: pair[parity] for name, pair in self._state.items()},
                      **{name: b for name, b in self._scalars.items() if name != STEP}}
            outputs = {f"{name}{UPDATED}": self._state[name][1 - parity] for name in self.state_names}
            bindings.append(function.bind_named(inputs, outputs))
        return StepBatch([], function.run_with_iobinding, bindings)

    def _device_state(self, count: int) -> _DeviceState:
        """The loss and step-number vectors (at least ``count`` long), the state's copy and the batches' bindings
        of passes over device rows, built on first use and grown when a pass has more batches."""
        device = self._on_device
        if device is None:
            device = self._on_device = _DeviceState(self._state, self.state_names, self.device)
        if device.losses.buffer.shape[0] < count:
            device.losses, device.steps = DeviceLosses(count, self.device), DeviceScalars(count, self.device)
        return device

    def release(self) -> None:
        """Free what the passes over device rows hold (the state's copy, the loss vectors, their bindings)."""
        self._on_device = None

    def set_learning_rate(self, learning_rate: float) -> None:
        if learning_rate != self._rate:
            self._scalars[LEARNING_RATE].write(np.float32(learning_rate))
            self._rate = learning_rate

    def step(self, batch: StepBatch) -> float:
        """One step on the rows in ``batch``'s feed buffers: its loss; the state it wrote is the other parity's,
        current only after :meth:`apply`."""
        if self._step_number is not None:
            self._step_number.write(np.float32(self.steps + 1))
        batch.run(batch.bindings[self.parity], None)
        return self._loss.scalar()

    def apply(self, batch: StepBatch | None = None) -> float:
        """Make the state the last step wrote the current one."""
        self.parity ^= 1
        self.steps += 1
        return 0.0

    def loss(self, data: TrainData) -> float:
        """The loss of ``data`` at the current weights, nothing updated."""
        current = self.current()
        feeds = dict(zip(self.feed_names, self.row_arrays(data)))
        values = [feeds[n] if n in feeds else current[n] for n in self.eval_function.input_names]
        return float(self.eval_function.run(*values)[0].numpy())

    # --- state ---
    def current(self) -> dict[str, DeviceBuffer]:
        return {name: pair[self.parity] for name, pair in self._state.items()}

    def get_weights(self) -> dict[str, np.ndarray]:
        current = self.current()
        return {name: current[name].read() for name in self.weights}

    def set_weights(self, values: dict[str, np.ndarray]) -> None:
        current = self.current()
        for name, value in values.items():
            expected = current[name].shape
            if value.shape != expected:
                raise ValueError(f"set_state: {name!r} has shape {expected}, the value has {value.shape}")
            current[name].write(value)

    def graphs(self) -> dict:
        return {"training_step": self.step_model}

    def get_optimizer_state(self) -> dict[str, np.ndarray]:
        """The optimizer's state (``<slot>:<weight>``, as forward-backward training's) and ``step``, as numpy
        arrays."""
        current = self.current()
        state = {key: current[name].read() for name, key in self._slot_keys.items()}
        state[STEP] = np.array(self.steps, dtype=np.int64)
        return state

    def set_optimizer_state(self, state: dict[str, np.ndarray]) -> None:
        missing = [key for key in (*self._slot_keys.values(), STEP) if key not in state]
        if missing:
            raise KeyError(f"the optimizer state has no {missing}; keys: {sorted(state)}")
        current = self.current()
        for name, key in self._slot_keys.items():
            current[name].write(np.asarray(state[key], dtype=np.float32))
        self.steps = int(state[STEP])


class _StepPass(DevicePass):
    """A pass of :class:`StepGraphRuntime` over device rows (:meth:`StepGraphRuntime.device_pass`)."""

    def __init__(self, runtime: StepGraphRuntime, rows: DeviceRows, count: int):
        self.runtime, self.rows = runtime, rows
        self.device = device = runtime._device_state(count)
        self.batches = device.batches
        self.start = (runtime.parity, runtime.steps)
        device.snapshot(runtime._state, runtime.state_names, runtime.parity)
        if runtime._step_number is not None:  # the pass's step numbers (as the host loop rounds them): one copy
            first = runtime.steps + 1
            device.steps.buffer.write(np.arange(first, first + device.steps.buffer.shape[0]).astype(np.float32))

    def new_batch(self, n: int, arrays) -> StepBatch:
        return self.runtime._device_batch(n)

    def feed(self, batch: StepBatch, rows: slice, index: int) -> None:
        runtime, device = self.runtime, self.device
        binding = batch.bindings[runtime.parity]
        self.rows.bind(binding, runtime.feed_names, rows)
        device.losses.bind(binding, runtime.loss_name, index)
        if runtime._step_number is not None:
            device.steps.bind_input(binding, STEP, index)

    def step(self, batch: StepBatch) -> None:
        runtime = self.runtime
        batch.run(batch.bindings[runtime.parity], None)
        runtime.parity ^= 1
        runtime.steps += 1

    def losses(self, count: int) -> np.ndarray:
        return self.device.losses.read(count)

    def rollback(self) -> None:
        runtime = self.runtime
        self.device.restore(runtime._state, runtime.state_names, self.start[0])
        runtime.parity, runtime.steps = self.start


class _DeviceState:
    """What passes over device rows keep (:meth:`StepGraphRuntime.device_pass`): the losses and the step
    numbers (float32 vectors, element ``i`` for step ``i`` of a pass), the batches' bindings by size, a copy of the
    state taken at each pass's start and the graph of Identity nodes that copies it on the device."""

    def __init__(self, state: dict, names: Sequence[str], device: str):
        self.losses = DeviceLosses(1, device)
        self.steps = DeviceScalars(1, device)
        self.batches: dict[int, StepBatch] = {}
        self.saved = {name: DeviceBuffer(state[name][0].shape, device) for name in names}
        copy = _copy_model([state[name][0].shape for name in names])
        self._copy = OnnxFunction(copy, device)
        self._bindings: dict = {}

    def _run_copy(self, sources: list, targets: list, key) -> None:
        binding = self._bindings.get(key)
        if binding is None:
            binding = self._bindings[key] = self._copy.bind(sources, targets)
        self._copy.run_bound(binding)

    def snapshot(self, state: dict, names: Sequence[str], parity: int) -> None:
        """Copy the state of ``parity`` into :attr:`saved` (on the device)."""
        self._run_copy([state[n][parity] for n in names], [self.saved[n] for n in names], ("save", parity))

    def restore(self, state: dict, names: Sequence[str], parity: int) -> None:
        """Copy :attr:`saved` back into the state of ``parity``."""
        self._run_copy([self.saved[n] for n in names], [state[n][parity] for n in names], ("restore", parity))


def _copy_model(shapes: Sequence[tuple]) -> onnx.ModelProto:
    """A graph copying float32 tensors of ``shapes``: input ``i`` to output ``i`` (one Identity each)."""
    nodes = [helper.make_node("Identity", [f"in{i}"], [f"out{i}"]) for i in range(len(shapes))]
    graph = helper.make_graph(
        nodes, "copy", [helper.make_tensor_value_info(f"in{i}", TensorProto.FLOAT, s) for i, s in enumerate(shapes)],
        [helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, s) for i, s in enumerate(shapes)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
