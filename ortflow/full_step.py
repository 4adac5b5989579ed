"""Full training on ortflow's own graph: one standard-ONNX graph per step (:func:`ortflow.autodiff.training_step`:
loss, gradients and the SGD/Adam/AdamW update) run by any onnxruntime, the plain build included.

Each batch size met (the batch size, and the shorter last batch) runs a step graph built for that many rows, whose
shape computations are constants (fewer nodes per step than the graph with a symbolic batch axis); all of them read
and write the same state. The weights and optimizer moments live in two sets of device buffers, read from one and
written to the other by two IO bindings used in turn; each batch size has its session, its batch buffers and its
two bindings, built once, so a batch copies its rows into the batch buffers and binds nothing. A step whose loss is not finite is not committed: the
state stays the one read (the buffers it wrote are the next step's outputs).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import onnx

from . import graph as g
from .artifact_cache import STEP_GRAPHS
from .autodiff import training_step
from .autodiff.training import LEARNING_RATE, STEP, UPDATED
from .learning_rates import BaseLearningRate
from .runtime import DeviceBuffer, OnnxFunction, SessionOptions

STATE_FILE = "step_state.npz"


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
        owners = {f"{w}_{slot}": w for w in self.weights for slot in rate.slots[1:]}  # state tensor -> its weight
        self._state = {}
        for name in self.state_names:
            start = inits[name] if name in inits else np.zeros(inits[owners[name]].shape, dtype=np.float32)
            self._state[name] = [DeviceBuffer(start.shape, device, start), DeviceBuffer(start.shape, device)]
        self._scalars = {n: DeviceBuffer((), device) for n in scalars if n in self.input_names}
        self._loss = DeviceBuffer((), device)
        self._batches: dict[tuple, tuple] = {}
        self.parity = 0
        self.steps = 0
        self._rate = None
        eval_graph = g.keep_outputs(g.initializers_as_inputs(loss_graph, self.weights), [loss_name])
        self.eval_function = OnnxFunction(eval_graph, device, options)

    # --- training ---
    def _batch(self, shapes: tuple, dtypes: tuple | None = None) -> tuple:
        """For one batch shape (and the feeds' dtypes, float32 by default): the feed buffers, the session's run and
        its two bindings (state read from parity 0 or 1)."""
        dtypes = dtypes or (np.float32,) * len(shapes)
        found = self._batches.get((shapes, dtypes))
        if found is None:
            function = self._cached(shapes[0][0])[1]
            if function.input_names != self.input_names:  # pragma: no cover - the same graph, rows fixed
                raise RuntimeError(f"the step graph for {shapes} has inputs {function.input_names}, "
                                   f"not {self.input_names}")
            feeds = {n: DeviceBuffer(shape, self.device, dtype=dtype)
                     for n, shape, dtype in zip(self.feed_names, shapes, dtypes)}
            bindings = []
            for parity in (0, 1):
                values = {**feeds, **{n: pair[parity] for n, pair in self._state.items()}, **self._scalars}
                outputs = [self._loss] + [self._state[n][1 - parity] for n in self.state_names]
                bindings.append(function.bind([values[n] for n in self.input_names], outputs))
            run = function.run_with_iobinding
            found = self._batches[shapes, dtypes] = ([feeds[n] for n in self.feed_names], run, bindings, function)
        return found

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

    def epoch(self, arrays: Sequence[np.ndarray], batches: Iterable, n_batches: int,
              learning_rate: float) -> np.ndarray:
        """Run one step per row selection of ``batches`` (slices or indices) over ``arrays`` (one per feed, in
        :attr:`feed_names` order) at ``learning_rate``; the loss of every batch, stopping at a non-finite one."""
        if learning_rate != self._rate:
            self._scalars[LEARNING_RATE].write(np.float32(learning_rate))
            self._rate = learning_rate
        step = self._scalars.get(STEP)
        n_samples = len(arrays[0])
        tails = [a.shape[1:] for a in arrays]
        dtypes = tuple(a.dtype for a in arrays)
        losses = np.empty(n_batches, dtype=np.float64)
        # per batch, only what must happen: the rows copied into the bound buffers (numpy's copy on CPU), one run,
        # the loss read; the batch shape's session and bindings are looked up once per size
        by_rows: dict[int, tuple] = {}
        copy, loss_buffer = np.copyto, self._loss
        for i, rows in enumerate(batches):
            is_slice = rows.__class__ is slice
            n = (min(rows.stop, n_samples) - rows.start) if is_slice else len(rows)
            entry = by_rows.get(n)
            if entry is None:
                buffers, run, bindings, _ = self._batch(tuple((n, *t) for t in tails), dtypes)
                targets = [b.array for b in buffers] if all(b.array is not None for b in buffers) else None
                entry = by_rows[n] = (buffers, targets, run, bindings)
            buffers, targets, run, bindings = entry
            if targets is not None and is_slice:
                for target, array in zip(targets, arrays):
                    copy(target, array[rows])
            else:
                for buffer, array in zip(buffers, arrays):
                    buffer.gather(array, rows)
            if step is not None:
                step.write(np.float32(self.steps + 1))
            run(bindings[self.parity], None)
            loss = loss_buffer.scalar()
            losses[i] = loss
            if loss - loss != 0.0:  # NaN or infinite: the step is not committed
                return losses[: i + 1]
            self.parity ^= 1
            self.steps += 1
        return losses

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

    def get_state(self) -> dict[str, np.ndarray]:
        """Weights, the optimizer's state (``<weight>_<slot>``: Adam's ``<weight>_m``, ``<weight>_v``) and ``step``
        as numpy arrays."""
        state = {name: buffer.read() for name, buffer in self.current().items()}
        state[STEP] = np.array(self.steps, dtype=np.int64)
        return state

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        missing = [n for n in (*self.state_names, STEP) if n not in state]
        if missing:
            raise KeyError(f"the optimizer state has no {missing}; keys: {sorted(state)}")
        current = self.current()
        for name in self.state_names:
            current[name].write(np.asarray(state[name], dtype=np.float32))
        self.steps = int(state[STEP])
