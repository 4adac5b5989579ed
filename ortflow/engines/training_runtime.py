"""The runtime protocol: what a trainer's onnxruntime side offers :class:`ortflow.trainers.base.BaseTrainer`'s one batch loop.

A trainer builds one :class:`TrainingRuntime` per fit (``_build_runtime`` stores it in ``_rt_runtime``); the base
class runs every batch through it and reads and writes the state through it. Its implementations:

- :class:`ortflow.engines.full_step.StepGraphRuntime`: ortflow's step graphs (full training, any onnxruntime build); its
  :meth:`~ortflow.engines.full_step.StepGraphRuntime.device_pass` trains data kept on the device (a :class:`DevicePass`);
- :class:`ortflow.trainers.full.ArtifactsRuntime`: onnxruntime-training's artifacts (full training, ``gradients='onnxruntime'``);
- :class:`ortflow.trainers.fwbw.ForwardBackwardRuntime` and :class:`ortflow.trainers.torch_trainer.TorchRuntime`: forward and
  backward passes, then the loss and update graphs (or torch's optimizer).

A batch (what :meth:`TrainingRuntime.new_batch` returns, built once per batch size) has ``inputs``, one
:class:`~ortflow.runtime.sessions.DeviceBuffer` per array of :meth:`TrainingRuntime.row_arrays`, which the loop fills with the
batch's rows, and ``rows``, the loop's row selection (a slice or indices).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from ..graph import editing as g
from ..data.graph_spec import TrainData


class TrainingRuntime:
    """The protocol (every method but :meth:`apply`, :meth:`release` and the optimizer state must be implemented)."""

    def row_arrays(self, data: TrainData) -> list[np.ndarray]:
        """The arrays whose rows a batch copies into its ``inputs`` (the unit ``data`` about to be trained)."""
        raise NotImplementedError

    def set_learning_rate(self, learning_rate: float) -> None:
        """The rate of the coming steps."""
        raise NotImplementedError

    def new_batch(self, n: int, arrays: Sequence[np.ndarray]):
        """The buffers (and whatever else) of batches of ``n`` rows of ``arrays``: built once per size."""
        raise NotImplementedError

    def step(self, batch) -> float:
        """One training step on the rows in ``batch.inputs``: its loss, the update not yet applied."""
        raise NotImplementedError

    def apply(self, batch) -> float:
        """Apply the step's update (called only after a finite loss); what it adds to the batch's loss (a penalty)."""
        return 0.0

    def loss(self, data: TrainData) -> float:
        """The loss of ``data`` at the current weights, nothing updated (validation)."""
        raise NotImplementedError

    def get_weights(self) -> dict[str, np.ndarray]:
        """The trained weights, copies."""
        raise NotImplementedError

    def set_weights(self, values: dict[str, np.ndarray]) -> None:
        """Replace trained weights (shapes checked: a ValueError naming the weight)."""
        raise NotImplementedError

    def get_optimizer_state(self) -> dict[str, np.ndarray]:
        """The optimizer's state, ``<slot>:<weight>`` and ``step`` (the public layout of every trainer)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no optimizer state ortflow can read")

    def set_optimizer_state(self, state: dict[str, np.ndarray]) -> None:
        raise NotImplementedError(f"{type(self).__name__} keeps no optimizer state ortflow can write")

    def graphs(self) -> dict:
        """Every graph the runtime runs (name -> ModelProto or bytes), for ``save_onnx_graph``."""
        raise NotImplementedError

    def release(self) -> None:
        """Drop what the runtime keeps of the training data between units (when training ends)."""


class LossGraphFeeds:
    """:meth:`TrainingRuntime.row_arrays` of a runtime fed in ``feed_names`` order from a loss graph's inputs: the
    data's, the label (``label_name``) and the sample weight (``weight_name``)."""

    feed_names: list[str]
    label_name: str | None = None
    weight_name: str | None = None
    #: the label's element type as the loss graph declares it: float32, or int64 (add_loss_output's log loss on
    #: binary probabilities, onnxcustom's way); None: as the data holds it
    label_dtype: np.dtype | None = None

    def row_arrays(self, data: TrainData) -> list[np.ndarray]:
        label = data.y if self.label_dtype is None else np.asarray(data.y, dtype=self.label_dtype)
        by_name = {**data.feeds, self.label_name: label, self.weight_name: data.weight}
        return [by_name[name] for name in self.feed_names]

    def declare_label(self, loss_graph: onnx.ModelProto) -> None:
        """Feed the label in the element type ``loss_graph`` declares for it."""
        if self.label_name is not None:
            self.label_dtype = onnx.helper.tensor_dtype_to_np_dtype(g.elem_type(loss_graph, self.label_name))


class DevicePass:
    """One pass of ortflow's step graph over rows kept on the device (what
    :meth:`ortflow.engines.full_step.StepGraphRuntime.device_pass` returns), run by the same batch loop: every step is
    applied as it runs (:meth:`step` returns None), the losses are read once at the end (:meth:`losses`), and a
    non-finite one rolls the state back to the pass's start (:meth:`rollback`) for the loop to replay the steps
    before it."""

    #: the batches by size (the loop's cache, kept between passes)
    batches: dict

    def new_batch(self, n: int, arrays):
        raise NotImplementedError

    def feed(self, batch, rows: slice, index: int) -> None:
        """Bind the rows ``rows`` and the step's ``index`` (its loss's place) into ``batch``."""
        raise NotImplementedError

    def step(self, batch) -> None:
        raise NotImplementedError

    def losses(self, count: int) -> np.ndarray:
        """The losses of the pass's ``count`` steps (one device-to-host copy)."""
        raise NotImplementedError

    def rollback(self) -> None:
        """The state, the step count and the parity back to those of the pass's start."""
        raise NotImplementedError
