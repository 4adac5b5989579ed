"""``OrtGradientOptimizer``: full training, where loss, gradient and update all run inside onnxruntime."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx

from ..graph import editing as g
from .._ort import TRAINING, OrtValueVector, api, artifacts, backend, captured_native_stderr, require_training
from ..runtime.device_data import DeviceRows, fits_on_device
from ..runtime.artifact_cache import TRAINING_ARTIFACTS
from .base import BaseTrainer
from ..data.graph_spec import GraphSpec, TrainData
from ..exceptions import (NotDifferentiableError, TrainingPackageError, UnsupportedModelError, explain_gradient_failure,
                          with_training_build_hint)
from ..engines.full_step import StepBatch, StepGraphRuntime
from ..runtime.placement import Placement
from ..engines.training_runtime import DevicePass, LossGraphFeeds, TrainingRuntime
from ..data.inputs import InputMapping
from ..optimizers.learning_rates import BaseLearningRate
from .parameters import TRAINERS, init_from
from .problem import TrainingProblem, loss_metadata, loss_problem, trainer_settings
from ..registry import register, select
from ..runtime.sessions import STEP_GRAPH_THREADS_THRESHOLD, THREADS_WORK_THRESHOLD, DeviceBuffer

ORT_CHECKPOINT = "ort_checkpoint"
ARTIFACTS = ("training_model", "eval_model", "optimizer_model")


class OrtGradientOptimizer(BaseTrainer):
    """Train a graph that already computes its loss (see :func:`ortflow.add_loss_output`).

    ``gradients`` says who builds the training graphs. ``'ortflow'``: one standard-ONNX graph per step
    (:func:`ortflow.autodiff.training_step`: loss, gradients and update) that any onnxruntime runs, the plain build
    included; weights and moments stay in onnxruntime buffers bound in and out. ``'onnxruntime'`` (training build
    only): artifacts from onnxruntime's ``artifacts.generate_artifacts``, each batch one ``train_step`` and one
    ``optimizer_step`` of the on-device training API. ``'auto'`` (:data:`ortflow.trainers.parameters.GRADIENTS`): ortflow's
    step graph (faster on the benchmark cases, docs/PERFORMANCE.md), and onnxruntime's artifacts on the training
    build for a graph holding an op outside ortflow's gradient rules. After ``fit``, ``gradients_`` and ``backend_``
    say what ran.

    ``learning_rate`` is shared with forward-backward training (see :mod:`ortflow.trainers.parameters`): a float or
    ``'sgd'`` runs SGD, its rate set per epoch from the schedule; any optimizer of :mod:`ortflow.optimizers.learning_rates`
    (a registered name, ``ortflow.registry.names('optimizer')``, or an object) runs its one update rule in ortflow's
    step graph. onnxruntime's artifacts (``gradients='onnxruntime'``) have SGD and AdamW only.
    """

    parameters = TRAINERS["OrtGradientOptimizer"]
    __init__ = init_from(parameters)
    _runtime_parameters = ("loss_output_name", "label_name", "sample_weight_name", "gradients")
    _state_file = "step_state.npz"  # ortflow's step graph; onnxruntime's artifacts save their own checkpoint
    #: whether ortflow's step graph trains on data kept on the device (:mod:`ortflow.runtime.device_data`, copied once per
    #: fit, :meth:`StepGraphRuntime.device_pass`): None, when ``device`` is CUDA and the data fits
    #: (:func:`~ortflow.runtime.device_data.fits_on_device`); True, on any device where it fits (the CPU included: how the
    #: tests run that loop); False, never. A private switch, not a parameter: the CPU's host loop is faster there.
    _device_data: bool | None = None

    # --- hooks ---------------------------------------------------------------------------------------------
    def _graph_spec(self, model: onnx.ModelProto) -> GraphSpec:
        outputs = g.output_names(model)
        if self.loss_output_name not in outputs:
            raise ValueError(
                f"loss_output_name={self.loss_output_name!r} is not an output of the graph (outputs: {outputs}); "
                "add one with ortflow.add_loss_output"
            )
        feeds = g.input_names(model)
        if self.label_name not in feeds:
            raise ValueError(f"label_name={self.label_name!r} is not an input of the graph (inputs: {feeds})")
        weight = self.sample_weight_name if self.sample_weight_name in feeds else None
        predictions = [o for o in outputs if o != self.loss_output_name]
        trained = loss_metadata(model).get("prediction")
        return GraphSpec(
            inputs=InputMapping.of(model, exclude=(self.label_name, weight)),
            label_shape=g.shape_of(model, self.label_name),
            weight_name=weight,
            prediction_outputs=predictions,
            trained_output=trained if trained in predictions else (predictions[0] if predictions else None),
        )

    def _trained_output_name(self, spec: GraphSpec) -> str:
        return self.loss_output_name

    def _threads_threshold(self) -> int:
        return THREADS_WORK_THRESHOLD if self.gradients == "onnxruntime" else STEP_GRAPH_THREADS_THRESHOLD

    def _loss_object(self):
        meta = loss_metadata(self._model)
        if not meta:
            raise ValueError("losses(): the graph's loss was not added by ortflow.add_loss_output, so its "
                             "per-sample definition is unknown")
        return select("loss", meta["loss"], **meta.get("params", {}))

    def _build_runtime(self, model: onnx.ModelProto, spec: GraphSpec, rate: BaseLearningRate) -> None:
        self._rt_rate = rate
        self._rt_device_rows = None  # (the TrainData, its DeviceRows or None where it does not fit)
        self.backend_ = backend()
        loss_graph = g.keep_outputs(model, [self.loss_output_name])
        self.weights_to_train_ = self._check_weights(model, loss_graph, self.loss_output_name)
        placement, options = self._placement(), self._session_options()
        feeds = dict(label=self.label_name, weight=spec.weight_name)
        if self.gradients == "onnxruntime":
            require_training("gradients='onnxruntime'")
        else:  # 'ortflow', or 'auto': ortflow's step graph first
            try:
                self._rt_runtime = StepGraphRuntime(loss_graph, self.loss_output_name, self.weights_to_train_, rate,
                                                    placement, options, **feeds)
                self.gradients_ = "ortflow"
                return
            except NotDifferentiableError as exc:
                if self.gradients == "ortflow" or not TRAINING:
                    raise with_training_build_hint(exc) from exc
        self.gradients_ = "onnxruntime"
        self._rt_runtime = ArtifactsRuntime(loss_graph, self.weights_to_train_, rate, placement, options, **feeds)

    def _device_pass(self, data: TrainData, order, count: int) -> DevicePass | None:
        runtime = self._rt_runtime
        if not isinstance(runtime, StepGraphRuntime) or getattr(self, "_streamed_fit", False):
            return None  # onnxruntime's artifacts, or a stream's chunks (each trained once): the host loop
        device = runtime.device
        if not (device != "cpu" if self._device_data is None else self._device_data):
            return None
        if order is not None and len(order) != data.n_samples:
            return None  # DeviceRows shuffles whole permutations
        kept = self._rt_device_rows
        if kept is None or kept[0] is not data:  # a new fit's data (an epoch trains the same TrainData again)
            arrays = runtime.row_arrays(data)
            nbytes = sum(a.size * (4 if a.dtype == np.float64 else a.itemsize) for a in arrays)
            fits = fits_on_device(nbytes, device, shuffled=order is not None)
            kept = self._rt_device_rows = (data, DeviceRows(arrays, device) if fits else None)
        rows = kept[1]
        if rows is None:
            return None
        if order is None:
            rows.unshuffle()
        else:
            rows.shuffle(order)
        return runtime.device_pass(rows, count)

    def _release_training_data(self) -> None:
        self._rt_device_rows = None
        self._rt_runtime.release()

    def _graphs(self) -> dict:
        return {"loss_model": self._model, **self._rt_runtime.graphs()}

    def _save_runtime_state(self, folder: str) -> None:
        if isinstance(self._rt_runtime, ArtifactsRuntime):
            return self._rt_runtime.save(folder)
        return super()._save_runtime_state(folder)

    def _load_runtime_state(self, folder: str) -> None:
        if isinstance(self._rt_runtime, ArtifactsRuntime):
            return self._rt_runtime.load(folder)
        return super()._load_runtime_state(folder)

    # --- what is trained -----------------------------------------------------------------------------------
    def _training_problem(self, model: onnx.ModelProto, weights, rate: BaseLearningRate) -> TrainingProblem:
        return loss_problem(type(self).__name__, model, self.loss_output_name, self.label_name,
                            self.sample_weight_name, weights, self.weights_to_train, rate, self.batch_size)

    def _exported_optimizer_state(self, rate: BaseLearningRate) -> dict[str, np.ndarray] | None:
        if isinstance(self._rt_runtime, StepGraphRuntime):
            return self.get_optimizer_state()
        if len(rate.slots) > 1:
            raise TrainingPackageError(
                f"this {type(self).__name__} trained with onnxruntime's artifacts (gradients_='onnxruntime'), whose "
                f"{type(rate).__name__} moments ortflow cannot read; export it before fit or fit it with "
                "gradients='ortflow'")
        return None  # plain SGD keeps no state

    @classmethod
    def _state_settings(cls, state) -> tuple[onnx.ModelProto, dict]:
        loss_model, settings = trainer_settings(state)
        m = state.package.manifest
        settings = {k: v for k, v in settings.items() if k not in ("learning_loss", "output_name")}
        settings.update(loss_output_name=m["loss"]["output"], label_name=m["loss_model"]["label"])
        if m["loss_model"]["weight"]:
            settings["sample_weight_name"] = m["loss_model"]["weight"]
        return loss_model, settings


register("trainer", OrtGradientOptimizer)


class ArtifactsRuntime(LossGraphFeeds, TrainingRuntime):
    """Full training on onnxruntime-training's artifacts (``gradients='onnxruntime'``, training build only): each
    batch one ``train_step`` and one ``optimizer_step`` of the on-device training API, the optimizer's rule
    onnxruntime's (:meth:`~ortflow.optimizers.learning_rates.BaseLearningRate.ort_optimizer`): a
    :class:`~ortflow.engines.training_runtime.TrainingRuntime` of ``loss_graph`` (label ``label``, sample weight
    ``weight``) training ``weights``."""

    def __init__(self, loss_graph: onnx.ModelProto, weights: list[str], rate: BaseLearningRate,
                 placement: Placement, options, label: str | None = None, weight: str | None = None):
        device = placement.device  # onnxruntime's Module takes a device string (its CUDA options are its own)
        self.device, self.options, self.weights = device, options, list(weights)
        self.label_name, self.weight_name = label, weight
        self.declare_label(loss_graph)
        optimizer = rate.ort_optimizer()  # before any work: Nesterov is refused here
        frozen = [n for n in g.trainable_initializers(loss_graph) if n not in self.weights]
        if device == "cpu":
            loss_graph = g.relu_as_mask(loss_graph)
        # The same graph fitted again (a GridSearchCV's clones) reuses the artifacts generated the first time.
        # The key leaves out the parameters that only give the rate's value (set every epoch, not in the graphs).
        key = TRAINING_ARTIFACTS.key(loss_graph.SerializeToString(), self.weights, frozen, *rate.graph_key(), device)
        generated = TRAINING_ARTIFACTS.get(key)
        # The artifacts are read into memory and their folder removed at once: nothing is left in the temporary
        # directory, even when the process is killed later.
        with tempfile.TemporaryDirectory(prefix="ortflow-full-") as folder:
            if generated is None:
                try:
                    with captured_native_stderr():
                        artifacts.generate_artifacts(
                            loss_graph,
                            requires_grad=self.weights,
                            frozen_params=frozen,
                            loss=None,
                            optimizer=optimizer,
                            artifact_directory=folder,
                        )
                except Exception as exc:  # the gradient builder reports ops without gradient as RuntimeError
                    raise explain_gradient_failure(exc) from exc
                generated = {f"{name}.onnx": Path(folder, f"{name}.onnx").read_bytes() for name in ARTIFACTS}
                generated["checkpoint"] = Path(folder, "checkpoint").read_bytes()
                TRAINING_ARTIFACTS.put(key, generated)
            else:
                for file, data in generated.items():
                    Path(folder, file).write_bytes(data)
            self.artifacts = {name: generated[f"{name}.onnx"] for name in ARTIFACTS}
            self._start_module(api.CheckpointState.load_checkpoint(os.path.join(folder, "checkpoint")), folder)

    def _start_module(self, state, folder: str | None = None) -> None:
        """Start onnxruntime's Module and Optimizer on ``state``, from the artifacts in ``folder`` (written from
        memory into a temporary folder when None)."""
        if folder is None:
            with tempfile.TemporaryDirectory(prefix="ortflow-full-") as tmp:
                for name, data in self.artifacts.items():
                    Path(tmp, f"{name}.onnx").write_bytes(data)
                return self._start_module(state, tmp)
        self.state = state
        self.module = api.Module(os.path.join(folder, "training_model.onnx"), state,
                                 os.path.join(folder, "eval_model.onnx"), self.device, self.options)
        self.optimizer = api.Optimizer(os.path.join(folder, "optimizer_model.onnx"), self.module)
        self._rate = None
        train_inputs = self.module.input_names()
        self.module.eval()
        eval_inputs = self.module.input_names()
        self.module.train()
        if train_inputs != eval_inputs:  # pragma: no cover - generate_artifacts keeps the same feeds
            raise UnsupportedModelError(f"training inputs {train_inputs} differ from eval inputs {eval_inputs}")
        self.feed_names = train_inputs

    def set_learning_rate(self, learning_rate: float) -> None:
        if learning_rate != self._rate:
            self.optimizer._optimizer.set_learning_rate(learning_rate)
            self._rate = learning_rate

    def new_batch(self, n: int, arrays) -> StepBatch:
        return StepBatch([DeviceBuffer((n, *a.shape[1:]), "cpu", dtype=a.dtype) for a in arrays], None, [])

    def step(self, batch) -> float:
        # onnxruntime's Module is called directly: its Python wrapper builds new vectors and converts every fetch
        fetches = OrtValueVector()
        self.module._model.train_step([b.array for b in batch.inputs], fetches)
        return float(fetches[0].numpy())

    def apply(self, batch) -> float:
        self.optimizer._optimizer.optimizer_step()
        self.module._model.lazy_reset_grad()
        return 0.0

    def loss(self, data: TrainData) -> float:
        module = self.module
        module.eval()
        try:
            fetches = OrtValueVector()
            module._model.eval_step(self.row_arrays(data), fetches)
            return float(fetches[0].numpy())
        finally:
            module.train()

    def get_weights(self) -> dict[str, np.ndarray]:
        params = self.state.parameters
        return {name: np.array(params[name].data) for name in self.weights}

    def set_weights(self, values: dict[str, np.ndarray]) -> None:
        params = self.state.parameters
        for name, value in values.items():
            expected = params[name].data.shape
            if value.shape != expected:
                raise ValueError(f"set_state: {name!r} has shape {expected}, the value has {value.shape}")
            params[name] = value

    def get_optimizer_state(self) -> dict[str, np.ndarray]:
        raise NotImplementedError("gradients='onnxruntime': onnxruntime's optimizer keeps its state in its own "
                                  "checkpoint (save_checkpoint writes it), not as arrays")

    def graphs(self) -> dict:
        return dict(self.artifacts)

    def save(self, folder: str) -> None:
        """Write onnxruntime's checkpoint (weights and optimizer state) into ``folder``."""
        api.CheckpointState.save_checkpoint(self.state, os.path.join(folder, ORT_CHECKPOINT), True)

    def load(self, folder: str) -> None:
        """Restart the module on the checkpoint :meth:`save` wrote into ``folder``."""
        path = os.path.join(folder, ORT_CHECKPOINT)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{folder!r} holds no onnxruntime checkpoint ({ORT_CHECKPOINT})")
        self._start_module(api.CheckpointState.load_checkpoint(path))
