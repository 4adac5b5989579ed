"""``TrainingProblem``: what a trainer trains, as one value: the loss graph and the prediction graph, the inputs by
role, the trained weights, the optimizer (its rule and schedule), the state table, the progress and the batch size.

Every trainer builds it (``trainer.training_problem()``, fitted or not): the training package's writer, and
whatever else needs to know what a trainer trains, read it there instead of the trainer's attributes. The state
table has ONE spelling of a state tensor's key, :func:`state_tensor` (``<weight>_<slot>``, the name the step graph
and the package give it); the trainers' public optimizer state (``get_optimizer_state``) keeps its layout
``<slot>:<weight>`` (:func:`ortflow.optimizers.learning_rates.slot_name`) and :func:`state_table` converts it.

:func:`loss_problem` reads a graph that computes its loss (full training), :func:`prediction_problem` a prediction
graph trained with a loss family (forward-backward and torch training: the loss added by
:func:`ortflow.add_loss_output`); :func:`trainer_settings` reads back, from a training package's state, the
settings a trainer continues with (``from_state``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..graph import editing as g
from ..objectives.add_loss import LOSS_METADATA, add_loss_output
from ..convert.sklearn import graph_classes
from ..exceptions import TrainingPackageError
from ..optimizers.learning_rates import STEP, BaseLearningRate, slot_name, state_tensor
from ..registry import family, select
from ..runtime.validation import check_weights_to_train

__all__ = ["TrainingProblem", "loss_problem", "prediction_problem", "state_table", "state_tensor",
           "trainer_settings"]

#: outputs that are probabilities or labels: a classifier trained on them records no classes of its own
_PROBABILITIES = ("output_probability", "output_label", "probabilities", "label")


@dataclass
class TrainingProblem:
    """What a trainer trains (see the module's docstring). ``state`` holds the weights and the optimizer's slots
    (keys :func:`state_tensor`), current values; ``progress`` the epochs completed, the optimizer ``steps`` and the
    ``rows_seen`` its schedule follows."""

    trainer: str  # the trainer's class name: its name in ortflow.registry's family "trainer"
    loss_model: onnx.ModelProto  # the graph with its loss output, current weights inside
    loss_output: str
    label: str  # the label input of loss_model
    weight_input: str | None  # its sample weight input
    weights: list[str]  # the trained weights
    rate: BaseLearningRate  # the optimizer: its update rule and its schedule (value_at)
    loss: dict  # the loss family's {"name", "params"}
    prediction: onnx.ModelProto  # the prediction graph (every output of the graph but the loss)
    classes: np.ndarray | None  # a classifier's classes (None: a regressor, or a graph of probabilities)
    state: dict[str, np.ndarray]
    progress: dict
    batch_size: int
    feature_names: list[str] | None = None
    prediction_output: str | None = None  # the output the loss applies to
    data_inputs: list[str] = field(default_factory=list)  # the inputs the data feeds (not label, weight, state)

    @property
    def optimizer(self) -> BaseLearningRate:
        """The optimizer (``rate``'s other name)."""
        return self.rate

    @property
    def slots(self) -> tuple[str, ...]:
        """The optimizer's state tensors per weight (the weight itself left out)."""
        return tuple(self.rate.slots[1:])

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """The optimizer's state in the trainers' public layout (``<slot>:<weight>`` and ``step``)."""
        state = {slot_name(slot, w): self.state[state_tensor(w, slot)] for w in self.weights for slot in self.slots}
        state[STEP] = np.array(int(self.progress.get("steps", 0)), dtype=np.int64)
        return state


def initial_state(model: onnx.ModelProto, weights: list[str], rate: BaseLearningRate) -> dict[str, np.ndarray]:
    """The state table of a fresh training: the graph's weights, the optimizer's slots at their start."""
    inits = g.get_initializers(model)
    state = {w: np.asarray(inits[w], np.float32) for w in weights}
    for w in weights:
        for slot in rate.slots[1:]:
            state[state_tensor(w, slot)] = np.asarray(rate.initial_slot(slot, state[w]), np.float32)
    return state


def state_table(state: dict[str, np.ndarray], weights: dict[str, np.ndarray],
                optimizer: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """``state`` (a state table) updated with the trainer's ``weights`` and its public ``optimizer`` state
    (``<slot>:<weight>`` keys; None: a state ortflow cannot read, the slots keep their start)."""
    state.update({k: np.asarray(v, np.float32) for k, v in weights.items() if k in state})
    for key, value in (optimizer or {}).items():
        if ":" in key:
            slot, weight = key.split(":", 1)
            state[state_tensor(weight, slot)] = np.asarray(value, np.float32)
    return state


def _weights(model: onnx.ModelProto, output: str, weights, weights_to_train) -> list[str]:
    """``weights`` (a fitted trainer's), else ``weights_to_train`` checked (None: every float initializer
    ``output`` reads)."""
    if weights is not None:
        return list(weights)
    return check_weights_to_train(model if weights_to_train is not None else g.keep_outputs(model, [output]),
                                  weights_to_train)


def loss_problem(trainer: str, model: onnx.ModelProto, loss_output: str, label: str, weight_input: str | None,
                 weights: list[str] | None, weights_to_train, rate: BaseLearningRate,
                 batch_size: int) -> TrainingProblem:
    """The problem of a graph ``model`` computing its loss ``loss_output`` (full training), weights at their start
    (:func:`fitted` adds a fitted trainer's state); ``weights`` a fitted trainer's trained weights, else None and
    ``weights_to_train`` the trainer's parameter."""
    feeds, outputs = g.input_names(model), g.output_names(model)
    if loss_output not in outputs or label not in feeds:
        raise TrainingPackageError(f"the graph has no loss output {loss_output!r} or no label input {label!r} "
                                   f"(outputs {outputs}, inputs {feeds}); add them with ortflow.add_loss_output")
    weights = _weights(model, loss_output, weights, weights_to_train)
    meta = loss_metadata(model)
    predictions = [o for o in outputs if o != loss_output]
    trained = meta.get("prediction") if meta.get("prediction") in predictions else (predictions or [None])[0]
    weight_input = weight_input if weight_input in feeds else None
    return TrainingProblem(
        trainer, model, loss_output, label, weight_input, list(weights), rate,
        {"name": meta.get("loss"), "params": meta.get("params", {})}, g.keep_outputs(model, predictions),
        None if trained in _PROBABILITIES else graph_classes(model), initial_state(model, weights, rate),
        {"epochs": 0, "steps": 0, "rows_seen": 0}, int(batch_size), prediction_output=trained,
        data_inputs=[n for n in g.input_names(model) if n not in (label, weight_input)])


def prediction_problem(trainer: str, model: onnx.ModelProto, output: str, weight_name: str | None, loss_object,
                       penalty, penalty_name, weights: list[str] | None, weights_to_train, rate: BaseLearningRate,
                       batch_size: int) -> TrainingProblem:
    """The problem of a prediction graph ``model`` whose output ``output`` is trained with ``loss_object`` (a loss
    family's instance): its loss graph is :func:`ortflow.add_loss_output`'s (label ``label``, sample weights
    ``weight_name`` unless the graph has that name); ``penalty`` (the object of the parameter ``penalty_name``)
    must add nothing (a package holds no penalty)."""
    if not penalty.is_null():
        raise TrainingPackageError(f"learning_penalty={penalty_name!r} ({penalty!r}): a training package holds the "
                                   "loss of add_loss_output without a penalty; train without one to export")
    weights = _weights(model, output, weights, weights_to_train)
    taken = g.all_names(model)
    loss, label = _fresh("loss", taken), _fresh("label", taken)
    weight_input = weight_name if weight_name not in taken else _fresh("weight", taken)
    loss_model = add_loss_output(model, loss_object, loss_name=loss, label_name=label, weight_name=weight_input,
                                 output_index=output)
    return TrainingProblem(
        trainer, loss_model, loss, label, weight_input, list(weights), rate,
        {"name": loss_object.names[0], "params": loss_object.get_params()},
        g.keep_outputs(model, g.output_names(model)), None if output in _PROBABILITIES else graph_classes(model),
        initial_state(model, weights, rate), {"epochs": 0, "steps": 0, "rows_seen": 0}, int(batch_size),
        prediction_output=output, data_inputs=g.input_names(model))


def fitted(problem: TrainingProblem, weights: dict[str, np.ndarray], optimizer: dict[str, np.ndarray] | None,
           epochs: int, rows_seen: int) -> TrainingProblem:
    """``problem`` with a fitted trainer's weights, public optimizer state (None: unreadable) and progress."""
    state_table(problem.state, weights, optimizer)
    problem.progress = {"epochs": int(epochs), "steps": int((optimizer or {}).get(STEP, 0)),
                        "rows_seen": int(rows_seen or 0)}
    return problem


def loss_metadata(model: onnx.ModelProto) -> dict:
    """What :func:`ortflow.add_loss_output` recorded of the loss it added ({} when it did not add it)."""
    return next((json.loads(e.value) for e in model.metadata_props if e.key == LOSS_METADATA), {})


def _fresh(base: str, taken: set) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    return name


def trainer_settings(state, loss_file: str = "loss.onnx") -> tuple[onnx.ModelProto, dict]:
    """``(loss graph with the state's weights, the settings)`` a trainer continues a training package's ``state``
    (a :class:`ortflow.package.TrainingState`) with: its optimizer, schedule, batch size and trained weights, and,
    for a trainer of a prediction graph, the loss family (``learning_loss``) and the trained output
    (``output_name``) the loss graph records."""
    m = state.package.manifest
    loss_model = g.replace_initializers(onnx.load_from_string(state.package.read(loss_file)), state.weights)
    optimizer = m["optimizer"]
    rate = family("optimizer")[optimizer["name"]](**optimizer["params"])
    settings = dict(learning_rate=rate, batch_size=m["batch_size"], weights_to_train=list(state.package.weights))
    meta = loss_metadata(loss_model)
    if meta.get("loss") is not None:
        settings["learning_loss"] = select("loss", meta["loss"], **meta.get("params", {}))
    if meta.get("prediction") is not None:
        settings["output_name"] = meta["prediction"]
    return loss_model, settings
