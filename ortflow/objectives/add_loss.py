"""``add_loss_output``: turn a prediction graph Y = f(W, X) into one that also computes loss(f(W, X), W, y)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Union

import onnx
from onnx import TensorProto, helper

from ..convert.sklearn import estimator_record, graph_classes
from .estimator_loss import estimator_loss
from ..graph.editing import (ModelLike, _fresh, all_names, check_loadable, elem_type, get_initializers, keep_outputs,
                             load_model, output_names, pick_output, shape_of, trainable_initializers, type_name)
from .losses import BaseLearningLoss
from ..convert.ml_op_rewrites import holds_linear_ops, make_trainable
from ..graph.builder import GraphBuilder
from .penalties import BaseLearningPenalty, ElasticLearningPenalty
from ..registry import lookup, select, settings_of

PenaltySpec = Mapping[str, Union[float, Mapping[str, float]]]
#: metadata key under which add_loss_output records the loss it added (read by ``OrtGradientOptimizer.losses``)
LOSS_METADATA = "ortflow.loss"
PROBABILITY_OUTPUTS = ("output_probability", "probabilities")


def add_loss_output(
    onx: ModelLike,
    score_name: str | BaseLearningLoss | None = None,
    loss_name: str = "loss",
    label_name: str = "label",
    weight_name: str | None = None,
    penalty: PenaltySpec | BaseLearningPenalty | str | None = None,
    output_index: int | str | None = None,
    l1_weight: float | None = None,
    l2_weight: float | None = None,
    n_samples: int | None = None,
) -> onnx.ModelProto:
    """Return a copy of ``onx`` with a new input ``label_name`` and a first output ``loss_name``.

    ``score_name`` is a loss of :mod:`ortflow.objectives.losses`, by name or instance: ``'squared_error'``/``'l2'``,
    ``'absolute_error'``/``'l1'``, ``'elastic'`` (``l1_weight * |d| + l2_weight * d**2``), ``'log'`` (log loss
    of raw scores: binary for one column with labels in {0, 1}, softmax cross-entropy with one-hot labels for k
    columns), or one of scikit-learn's (``'huber'``, ``'hinge'``, ``'quantile'``, ``'poisson'``... docs/LOSSES.md).
    With ``w`` the optional per-sample weight input ``weight_name`` (1 when absent), the loss is ``mean(w * l)``.

    ``score_name=None`` picks the loss and penalty of the estimator the graph comes from (recorded by
    :func:`ortflow.to_onnx`; :func:`ortflow.objectives.estimator_loss.estimator_loss`), ``'squared_error'`` for other graphs;
    an explicit ``penalty`` replaces the estimator's. ``n_samples`` (the number of training samples) is needed by the
    penalty of an estimator whose objective sums its losses (Ridge, HuberRegressor, LinearSVC, LinearSVR,
    LogisticRegression). The choice is recorded in the graph's metadata (key :data:`LOSS_METADATA`).

    ``penalty`` maps initializer names to ``{'l1': a, 'l2': b}`` (or to ``b`` alone, meaning L2) and adds
    ``a * sum|w| + b * sum(w**2)`` for each; or it is a penalty of :mod:`ortflow.objectives.penalties` (an instance or a
    registered name), whose value joins the loss for every float initializer it penalizes (its ``weights``; None:
    all of them), as forward-backward training adds it to the weights it trains. ``output_index`` picks the
    prediction by position or name (default: the only output, or ``raw_score`` when the graph has one). The
    original outputs are kept after the loss, except a result the graph computes under ``label_name`` (skl2onnx's
    predicted ``label``): it is dropped, as onnxcustom does, so that the label input takes its name. A
    classification loss on skl2onnx's binary probabilities ``[1 - sigmoid(s), sigmoid(s)]`` applies to ``s``,
    added as the output ``raw_score``, and its label input is int64 (the labels 0 and 1, as onnxcustom declares it;
    the trainers feed it as the graph declares); every other label input is float32.

    A graph straight from skl2onnx, whose ``ai.onnx.ml`` LinearRegressor / LinearClassifier keeps its weights in
    attributes, is first made trainable with :func:`ortflow.make_trainable` (the rewrite is exact and unique, so
    the loss is added where a trainer can reach the weights: ``coef``/``intercept``, and ``raw_score`` for a
    classifier).
    """
    model = load_model(onx)
    check_loadable(model, "onx")
    if holds_linear_ops(model):
        model = make_trainable(model)
    chosen_from = None
    if score_name is None:
        score_name, settings, own_penalty = estimator_loss(model, n_samples)
        chosen_from = estimator_record(model).get("class")
        penalty = own_penalty if penalty is None else penalty
        loss = select("loss", score_name, "score_name", **settings)
    else:
        # l1_weight and l2_weight are the elastic loss's settings (onnxcustom's signature passes them to every loss);
        # None leaves the loss class's default
        elastic = isinstance(score_name, str) and "l1_weight" in settings_of(lookup("loss", score_name) or object)
        given = {k: v for k, v in dict(l1_weight=l1_weight, l2_weight=l2_weight).items() if v is not None}
        loss = select("loss", score_name, "score_name", **(given if elastic else {}))
    loss.check()
    record = estimator_record(model)
    if loss.task == "classification" and record and graph_classes(model) is None:
        raise ValueError(f"score_name={score_name!r} is a classification loss, but the graph comes from a regressor "
                         f"({record['class']}): pick a regression loss")
    output = pick_output(model, output_index, "output_index")
    model = _free_label_name(model, label_name, output)
    label_type = TensorProto.FLOAT
    if loss.task == "classification" and output in PROBABILITY_OUTPUTS:
        model, output = _raw_score_behind(model, output, score_name)
        label_type = TensorProto.INT64  # onnxcustom's binary path: the labels themselves, 0 or 1, as int64
    existing = all_names(model)
    for arg, name in (("loss_name", loss_name), ("label_name", label_name), ("weight_name", weight_name)):
        if name is not None and name in existing:
            raise ValueError(f"{arg}={name!r} collides with a name already in the graph; pick another name")
    if elem_type(model, output) != TensorProto.FLOAT:
        raise ValueError(f"output {output!r} is {type_name(model, output)}, not float32: only float32 predictions "
                         "can carry a loss; convert the graph to float32 (its weights, inputs and casts) first")
    shape = shape_of(model, output)
    if len(shape) not in (1, 2):
        raise ValueError(f"output {output!r} has rank {len(shape)}; the loss expects (N,) or (N, k)")
    width = shape[1] if len(shape) == 2 and isinstance(shape[1], int) and shape[1] > 0 else None

    b = GraphBuilder(prefix=f"{loss_name}", taken=all_names(model))  # its nodes join the model's graph
    target = label_name if label_type == TensorProto.FLOAT else b.op("Cast", [label_name], to=TensorProto.FLOAT)
    total = loss.mean_loss(b, output, target, weight_name, len(shape), width)
    if penalty:
        total = b.add_all([total, *_penalty_terms(b, model, penalty)])
    b.output(total, loss_name, [])

    new = onnx.ModelProto()
    new.CopyFrom(model)
    new.graph.input.append(helper.make_tensor_value_info(label_name, label_type, ["N"] + [width] * (len(shape) - 1)))
    if weight_name is not None:
        new.graph.input.append(helper.make_tensor_value_info(weight_name, TensorProto.FLOAT, ["N"]))
    new.graph.node.extend(b.nodes)
    old_outputs = list(new.graph.output)
    del new.graph.output[:]
    new.graph.output.extend(b.outputs)
    new.graph.output.extend(old_outputs)
    entry = new.metadata_props.add()
    entry.key, entry.value = LOSS_METADATA, json.dumps({
        "loss": loss.names[0], "params": loss.get_params(), "prediction": output, "label": label_name,
        "weight": weight_name, "loss_output": loss_name, "penalty": _recorded(penalty), "chosen_from": chosen_from,
    })
    onnx.checker.check_model(new)
    return new


def _free_label_name(model: onnx.ModelProto, label_name: str, output: str) -> onnx.ModelProto:
    """``model`` without the result it computes under ``label_name``, so that the label input can take that name.

    skl2onnx names a classifier's predicted label ``label``, the label input's default name: that output is not
    needed for training, so it is dropped with the nodes only it needs (onnxcustom's ``add_loss_output`` does the
    same), and an intermediate result of that name is renamed. A graph input or initializer of that name stays a
    collision (reported by the caller)."""
    computed = {name for node in model.graph.node for name in node.output}
    if label_name not in computed or label_name == output:
        return model
    new = onnx.ModelProto()
    new.CopyFrom(model)
    if label_name in output_names(new):
        pruned = keep_outputs(new, [name for name in output_names(new) if name != label_name])
        pruned.metadata_props.extend(new.metadata_props)
        new = pruned
    renamed = _fresh(f"{label_name}_", all_names(new))
    for node in new.graph.node:
        for names in (node.input, node.output):
            for i, name in enumerate(names):
                if name == label_name:
                    names[i] = renamed
    return new


def _raw_score_behind(model: onnx.ModelProto, output: str, score_name) -> tuple[onnx.ModelProto, str]:
    """The raw score the probabilities ``output`` come from, added as an output ``raw_score`` (a fresh name if taken).

    The log loss of probabilities ``[1 - sigmoid(s), sigmoid(s)]`` (skl2onnx's binary linear classifier with
    LinearClassifier blocked, the graph onnxcustom trains with ``add_loss_output(onx, 'log', output_index=1)``) is
    the binary log loss of ``s``: the loss goes there, where its gradient does not vanish as the probabilities
    saturate. Other probability graphs are refused."""
    producer = {name: node for node in model.graph.node for name in node.output}
    score = _sigmoid_pair_input(model, producer, output)
    if score is None:
        raise ValueError(f"score_name={score_name!r} applies to raw scores, but output {output!r} holds probabilities "
                         f"computed otherwise than [1 - sigmoid(s), sigmoid(s)]: pick the raw score with output_index "
                         "(ortflow.to_onnx names it 'raw_score')")
    new = onnx.ModelProto()
    new.CopyFrom(model)
    name = _fresh("raw_score", all_names(new))
    new.graph.node.append(helper.make_node("Identity", [score], [name], name=f"{name}_of_{score}"))
    new.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", 1]))
    return new, name


def _sigmoid_pair_input(model: onnx.ModelProto, producer: dict, output: str) -> str | None:
    """``s`` when ``output`` is ``Concat([1 - Sigmoid(s), Sigmoid(s)], axis=1)`` with ``s`` of one column."""
    concat = producer.get(output)
    if concat is None or concat.op_type != "Concat" or len(concat.input) != 2:
        return None
    if [a.i for a in concat.attribute if a.name == "axis"] not in ([1], [-1]):
        return None
    sub, sigmoid = producer.get(concat.input[0]), producer.get(concat.input[1])
    if (sub is None or sigmoid is None or sub.op_type != "Sub" or sigmoid.op_type != "Sigmoid"
            or sub.input[1] != sigmoid.output[0]):
        return None
    one = get_initializers(model).get(sub.input[0])
    if one is None or one.size != 1 or float(one.reshape(-1)[0]) != 1.0:
        return None
    score = sigmoid.input[0]
    inferred = onnx.shape_inference.infer_shapes(model)
    for value in list(inferred.graph.value_info) + list(inferred.graph.input):
        if value.name == score:
            dims = [d.dim_value or None for d in value.type.tensor_type.shape.dim]
            return score if len(dims) == 2 and dims[1] in (1, None) else None
    return score


def _recorded(penalty: PenaltySpec | BaseLearningPenalty | str | None) -> dict:
    """The penalty as the metadata records it: weight -> {'l1': a, 'l2': b}, or a penalty object's name and
    settings."""
    if isinstance(penalty, (str, BaseLearningPenalty)):
        chosen = select("penalty", penalty)
        return {"name": type(chosen).names[0] or type(chosen).__name__,
                "params": chosen.get_params(deep=False)}
    return {name: ({k: float(v) for k, v in coef.items()} if isinstance(coef, Mapping) else {"l2": float(coef)})
            for name, coef in (penalty or {}).items()}


def _penalty_terms(b: GraphBuilder, model: onnx.ModelProto, penalty: PenaltySpec | BaseLearningPenalty | str
                   ) -> list[str]:
    floats = {i.name for i in model.graph.initializer if i.data_type == TensorProto.FLOAT}
    if isinstance(penalty, (str, BaseLearningPenalty)):
        chosen = select("penalty", penalty, "penalty")
        chosen.check()
        unknown = sorted(set(getattr(chosen, "weights", None) or ()) - floats)
        if unknown:
            raise ValueError(f"penalty names {unknown}, which are not float32 initializers; candidates: {sorted(floats)}")
        values = (chosen.add_value(b, name) for name in trainable_initializers(model)
                  if name in floats and chosen.penalizes(name))
        return [v for v in values if v is not None]
    terms = []
    for name, coef in penalty.items():
        if name not in floats:
            raise ValueError(f"penalty names {name!r}, which is not a float32 initializer; candidates: {sorted(floats)}")
        if isinstance(coef, Mapping):
            unknown = set(coef) - {"l1", "l2"}
            if unknown:
                raise ValueError(f"penalty[{name!r}] has unknown keys {sorted(unknown)}; use 'l1' and 'l2'")
            term = ElasticLearningPenalty(l1=coef.get("l1", 0.0), l2=coef.get("l2", 0.0), weights=[name])
        else:
            term = ElasticLearningPenalty(l1=0.0, l2=coef, weights=[name])
        term.check()
        value = term.add_value(b, name)
        if value is not None:
            terms.append(value)
    return terms
