"""Full training on ortflow's own graph: one standard-ONNX graph per step (:func:`ortflow.autodiff.training_step`:
loss, gradients and the SGD/Adam/AdamW update) run by any onnxruntime, the plain build included.

Each batch size met (the batch size, and the shorter last batch) runs a step graph built for that many rows, whose
shape computations are constants (fewer nodes per step than the graph with a symbolic batch axis); all of them read
and write the same state. The weights and optimizer moments live in two sets of device buffers, read from one and
written to the other by two IO bindings used in turn; each batch size has its session, its batch buffers and its
two bindings, built once, so a batch copies its rows into the batch buffers and binds nothing. A step whose loss is not
finite is not applied (:meth:`StepGraphRuntime.apply`): the state stays the one read (the buffers it wrote are the
next step's outputs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from . import graph as g
from .artifact_cache import STEP_GRAPHS
from .autodiff import training_step
from .autodiff.training import LEARNING_RATE, STEP, UPDATED
from .learning_rates import BaseLearningRate, slot_name
from .runtime import DeviceBuffer, OnnxFunction, SessionOptions

@dataclass
class StepBatch:
    """What a batch size has, built once: its feed buffers (``inputs``, in feed order), the session's run and its
    two bindings; ``rows`` is the batch's row selection, set by the trainer's loop."""

    inputs: list[DeviceBuffer]
    run: Callable
    bindings: list
    rows: object = None


class StepGraphRuntime:
    """Runs :func:`~ortflow.autodiff.training_step` graphs of ``loss_graph`` (a scalar output ``loss_name``)
    training ``weights`` with the optimizer ``rate`` (its update rule written into the step graph)."""

    def __init__(self, loss_graph: onnx.ModelProto, loss_name: str, weights: Sequence[str], rate: BaseLearningRate,
                 device: str, options: SessionOptions):
        self.device = device
        self.weights = list(weights)
        self._build = dict(loss_model=loss_graph, weights=self.weights, loss_output=loss_name, optimizer=rate)
        self._options = options
        # what the graphs are built from, hashed once: the same graph fitted again reuses them and their sessions
        self._key = STEP_GRAPHS.key(loss_graph.SerializeToString(), self.weights, loss_name, rate.graph_key(),
                                    device, options.intra_op_num_threads)
        # the graph with a symbolic batch axis: what is saved, and the names every batch shape's graph shares
        self.step_model = self._cached(None)[0]
        self.input_names = [i.name for i in self.step_model.graph.input]
        self.loss_name = loss_name
        self.state_names = [o.name[: -len(UPDATED)] for o in self.step_model.graph.output[1:]]
        scalars = (LEARNING_RATE, STEP)
        self.feed_names = [n for n in self.input_names if n not in self.state_names and n not in scalars]
        inits = g.get_initializers(loss_graph)
        # a state tensor of the step graph (``<weight>_<slot>``) -> its weight, and its key in the optimizer state
        owners = {f"{w}_{slot}": w for w in self.weights for slot in rate.slots[1:]}
        self._slot_keys = {f"{w}_{slot}": slot_name(slot, w) for w in self.weights for slot in rate.slots[1:]}
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
        eval_graph = g.keep_outputs(g.initializers_as_inputs(loss_graph, self.weights), [loss_name])
        self.eval_function = OnnxFunction(eval_graph, device, options)

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
        once per process for a given graph and settings (:data:`~ortflow.artifact_cache.STEP_GRAPHS`)."""
        key = f"{self._key}/{rows}"
        entry = STEP_GRAPHS.get(key)
        if entry is None:
            model = training_step(**self._build, batch_rows=rows)
            entry = (model, None if rows is None else OnnxFunction(model, self.device, self._options))
            STEP_GRAPHS.put(key, entry)
        return entry

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

    def apply(self) -> None:
        """Make the state the last step wrote the current one."""
        self.parity ^= 1
        self.steps += 1

    def loss(self, arrays: Sequence[np.ndarray]) -> float:
        """The loss of ``arrays`` (one per feed) at the current weights, nothing updated."""
        current = self.current()
        feeds = dict(zip(self.feed_names, arrays))
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
