"""Reading an ortflow trainer into what a training package is made of (:class:`_Trainer`): its loss graph, weights,
optimizer slots, optimizer, schedule, progress and batch size (moved unchanged from ``ortflow.package_export``;
the ``problem`` work replaces it by each trainer's ``training_problem()``)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import onnx

from .. import graph as g
from ..add_loss import LOSS_METADATA, add_loss_output
from ..convert import graph_classes
from ..exceptions import TrainingPackageError
from ..learning_rates import STEP, BaseLearningRate
from ..ml_op_rewrites import make_trainable
from ..validation import check_weights_to_train

_PROBABILITIES = ("output_probability", "output_label", "probabilities", "label")


@dataclass
class _Trainer:
    """What a package is made of, read from an ortflow trainer."""

    trainer: str
    loss_model: onnx.ModelProto  # the graph with its loss output, current weights inside
    loss_output: str
    label: str
    weight_input: str | None
    weights: list[str]
    rate: BaseLearningRate
    loss: dict
    prediction: onnx.ModelProto
    classes: np.ndarray | None
    state: dict[str, np.ndarray]  # weights and slots (``<weight>_<slot>``), current values
    progress: dict
    batch_size: int
    feature_names: list[str] | None = None


def _read_trainer(estimator) -> _Trainer:
    from ..full import OrtGradientOptimizer
    from ..fwbw import OrtGradientForwardBackwardOptimizer

    if isinstance(estimator, OrtGradientOptimizer):
        return _full_trainer(estimator)
    if isinstance(estimator, OrtGradientForwardBackwardOptimizer):
        return _fwbw_trainer(estimator)
    raise TrainingPackageError(f"export_training_package takes an OrtGradientOptimizer or an "
                               f"OrtGradientForwardBackwardOptimizer, not {type(estimator).__name__}")


def _fitted(estimator) -> bool:
    return hasattr(estimator, "history_")


def _full_trainer(est) -> _Trainer:
    model = make_trainable(g.load_model(est.model_onnx), est.weights_to_train)
    loss, label = est.loss_output_name, est.label_name
    feeds, outputs = g.input_names(model), g.output_names(model)
    if loss not in outputs or label not in feeds:
        raise TrainingPackageError(f"the graph has no loss output {loss!r} or no label input {label!r} "
                                   f"(outputs {outputs}, inputs {feeds}); add them with ortflow.add_loss_output")
    meta = next((json.loads(e.value) for e in model.metadata_props if e.key == LOSS_METADATA), {})
    predictions = [o for o in outputs if o != loss]
    trained = meta.get("prediction") if meta.get("prediction") in predictions else (predictions or [None])[0]
    loss_graph = g.keep_outputs(model, [loss])
    weights = (list(est.weights_to_train_) if _fitted(est) else
               check_weights_to_train(model if est.weights_to_train is not None else loss_graph,
                                      est.weights_to_train))
    rate = est._learning_rate()
    state, progress = _initial_state(model, weights, rate), {"epochs": 0, "steps": 0, "rows_seen": 0}
    if _fitted(est):
        runtime = getattr(est, "_rt_step", None)
        if runtime is None and len(rate.slots) > 1:
            raise TrainingPackageError(
                f"this {type(est).__name__} trained with onnxruntime's artifacts (gradients_='onnxruntime'), whose "
                f"{type(rate).__name__} moments ortflow cannot read; export it before fit or fit it with "
                "gradients='ortflow'")
        progress = _fitted_state(est, state, moments=runtime is not None)
    return _Trainer(type(est).__name__, model, loss, label, est.sample_weight_name if est.sample_weight_name in feeds
                    else None, weights, rate, {"name": meta.get("loss"), "params": meta.get("params", {})},
                    g.keep_outputs(model, predictions), None if trained in _PROBABILITIES else graph_classes(model),
                    state, progress, int(est.batch_size), _feature_names(est))


def _fitted_state(est, state: dict[str, np.ndarray], moments: bool = True) -> dict:
    """``state`` updated with a fitted trainer's weights and optimizer state (``get_optimizer_state``'s
    ``<slot>:<weight>`` become the step graph's ``<weight>_<slot>``); its progress. ``moments=False``: a trainer
    whose optimizer keeps no moments ortflow can read (onnxruntime's artifacts, plain SGD), weights only."""
    state.update({k: np.asarray(v, np.float32) for k, v in est.get_state().items() if k in state})
    optimizer = est.get_optimizer_state() if moments else {}
    for key, value in optimizer.items():
        if ":" in key:
            slot, weight = key.split(":", 1)
            state[f"{weight}_{slot}"] = np.asarray(value, np.float32)
    return _progress(est, int(optimizer.get(STEP, 0)))


def _fwbw_trainer(est) -> _Trainer:
    from ..base import prediction_spec
    from ..estimator_loss import own_loss, own_penalty

    model = make_trainable(g.load_model(est.model_onnx), est.weights_to_train)
    spec = prediction_spec(model, est.output_name, est.weight_name)
    penalty = own_penalty(model, est.learning_loss, est.learning_penalty)
    if not penalty.is_null():
        raise TrainingPackageError(f"learning_penalty={est.learning_penalty!r} ({penalty!r}): a training package "
                                   "holds the loss of add_loss_output without a penalty; train without one to export")
    loss_object = own_loss(model, est.learning_loss)
    taken = g.all_names(model)
    loss, label = _fresh("loss", taken), _fresh("label", taken)
    weight_input = spec.weight_name if spec.weight_name not in taken else _fresh("weight", taken)
    loss_model = add_loss_output(model, loss_object, loss_name=loss, label_name=label, weight_name=weight_input,
                                 output_index=spec.trained_output)
    output = spec.trained_output
    weights = (list(est.weights_to_train_) if _fitted(est) else
               check_weights_to_train(model if est.weights_to_train is not None else g.keep_outputs(model, [output]),
                                      est.weights_to_train))
    rate = est._learning_rate()
    state, progress = _initial_state(model, weights, rate), {"epochs": 0, "steps": 0, "rows_seen": 0}
    if _fitted(est):
        progress = _fitted_state(est, state)
    return _Trainer(type(est).__name__, loss_model, loss, label, weight_input, weights, rate,
                    {"name": loss_object.names[0], "params": loss_object.get_params()},
                    g.keep_outputs(model, g.output_names(model)),
                    None if output in _PROBABILITIES else graph_classes(model), state, progress, int(est.batch_size),
                    _feature_names(est))


def _fresh(base: str, taken: set) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    return name


def _initial_state(model: onnx.ModelProto, weights: list[str], rate: BaseLearningRate) -> dict[str, np.ndarray]:
    inits = g.get_initializers(model)
    state = {w: np.asarray(inits[w], np.float32) for w in weights}
    for w in weights:
        for slot in rate.slots[1:]:
            state[f"{w}_{slot}"] = np.asarray(rate._initial_slot(slot, state[w]), np.float32)
    return state


def _progress(est, steps: int) -> dict:
    return {"epochs": len(est.history_), "steps": steps, "rows_seen": int(getattr(est, "_samples_seen", 0) or 0)}


def _feature_names(est) -> list[str] | None:
    names = getattr(est, "feature_names_in_", None)
    return None if names is None else [str(n) for n in names]
