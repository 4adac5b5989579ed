"""One standard-ONNX graph per training step: loss, gradients and the optimizer's update (its rule written once in
:mod:`ortflow.optimizers.learning_rates`), run by a plain onnxruntime."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import TensorProto, helper

from ..graph.editing import ModelLike, all_names, load_model, pick_output
from ..optimizers.learning_rates import LEARNING_RATE, STEP, BaseLearningRate, GraphOps, state_tensor
from ..registry import family, names
from .builder import build_gradients, refuse_unreached
from .derivative import assemble, pick_weights, value_info
from ..graph.builder import Emitter, ValueInfo
from .measured_shapes import with_measured_shapes

UPDATED = "_updated"


def training_step(
    loss_model: ModelLike,
    weights: Sequence[str] | None = None,
    optimizer: str | BaseLearningRate = "sgd",
    loss_output: str | None = None,
    betas: tuple[float, float] = (0.9, 0.999),
    epsilon: float = 1e-8,
    weight_decay: float = 0.0,
    batch_rows: int | None = None,
) -> onnx.ModelProto:
    """The graph of one optimizer step on ``loss_model`` (a scalar loss, e.g. from :func:`ortflow.add_loss_output`).

    ``optimizer`` is an optimizer of :mod:`ortflow.optimizers.learning_rates` (an instance, or a registered name,
    ``ortflow.registry.names('optimizer')``; a name takes ``betas``, ``epsilon`` and ``weight_decay`` where its
    class has them). Its update rule, the same one forward-backward training runs, is
    written into the graph.

    Inputs: the model's inputs, the trained ``weights`` (default: every float initializer), the optimizer's state
    ``<weight>_<slot>`` of each weight (Adam's ``<weight>_m`` and ``<weight>_v``), then ``learning_rate`` and, for
    the rules that read it, ``step`` (float scalars; ``step`` counts updates from 1). Outputs: the loss (at the
    weights fed in), then ``<name>_updated`` for each weight and state tensor, in input order.

    SGD (``w - learning_rate * g``) seeds the backward pass with the learning rate when the loss is float: the
    gradients come out already scaled and each update is one ``Sub``, or folded into the ``Gemm`` that computes it.

    ``loss_output`` defaults to the first output. Every input's first axis, when not fixed, is declared as one
    symbol ``batch``: a training batch slices all inputs by rows, and knowing it lets the gradient sum broadcast
    axes without run-time checks. With ``batch_rows`` that axis is fixed to this many rows: a graph for one batch
    shape, whose shape computations (counts, broadcast shapes) are constants; the shapes onnx's inference cannot
    settle (an exported attention's reshapes) are measured by one run (:mod:`.measured_shapes`), so no broadcast
    axis is left to find at run time.
    """
    rate = _optimizer(optimizer, betas, epsilon, weight_decay)
    model = _one_batch_axis(load_model(loss_model), batch_rows)
    if batch_rows is not None:  # every shape fixed: settle those onnx's inference leaves open (no NonZero after)
        model = with_measured_shapes(model)
    weights = pick_weights(model, weights)
    if not weights:
        raise ValueError("training_step needs at least one float initializer to train")
    wide = [w for w in weights if _init_type(model, w) != TensorProto.FLOAT]
    if wide:
        raise ValueError(f"training_step trains float32 weights; {wide} have another type")
    loss = pick_output(model, loss_output, "loss_output", first=True)
    declared = {v.name: v for v in model.graph.output}[loss].type.tensor_type
    if declared.HasField("shape") and declared.shape.dim:
        raise ValueError(f"loss output {loss!r} has rank {len(declared.shape.dim)}; training_step needs a scalar loss")
    slots = {w: {slot: state_tensor(w, slot) for slot in rate.slots[1:]} for w in weights}
    moments = [name for w in weights for name in slots[w].values()]
    state = weights + moments
    scalars = [LEARNING_RATE] + ([STEP] if rate.per_step_scalars else [])
    new_names = {*scalars, *moments, *(s + UPDATED for s in state)}
    clash = sorted(new_names & all_names(model))
    if clash:
        raise ValueError(f"training_step adds the names {clash}, which already exist in the graph; rename them")
    # plain SGD seeds the backward pass with the (float) learning rate when the loss is float too: the gradients
    # come out already scaled and each update is one Sub (one Mul per weight fewer)
    scaled = rate.plain_step and declared.elem_type == TensorProto.FLOAT
    gradients = build_gradients(model, weights, loss, seed=LEARNING_RATE if scaled else None, taken=new_names)
    refuse_unreached(model, [w for w in weights if gradients.grads[w] is None], loss)
    e = gradients.emitter
    grads = dict(gradients.grads)
    for name in scalars:
        e.info[name] = ValueInfo(TensorProto.FLOAT, [])
    for w in weights:
        for name in slots[w].values():
            e.info[name] = ValueInfo(TensorProto.FLOAT, e.info[w].shape)
    if scaled:
        for w in weights:
            if not _update_in_gemm(e, w, grads[w]):
                e.op_named("Sub", [w, grads[w]], w + UPDATED)
    else:
        ops = GraphOps(e)
        given = {w: (w, grads[w], slots[w]) for w in weights}
        new = rate.write_update(ops, given, LEARNING_RATE, STEP if STEP in scalars else None)
        for w in weights:
            _name_output(e, new[w]["weight"], w + UPDATED)
            for slot, name in slots[w].items():
                _name_output(e, new[w][slot], name + UPDATED)
    outputs = [value_info(s + UPDATED, e.info[s]) for s in state]
    inputs = [value_info(m, e.info[m]) for m in moments] + [value_info(s, e.info[s]) for s in scalars]
    return assemble(model, gradients, {}, [loss], inputs, weights, outputs)


def _optimizer(optimizer: str | BaseLearningRate, betas, epsilon: float, weight_decay: float) -> BaseLearningRate:
    """The optimizer object ``training_step`` writes: an instance as given, a name with the settings its class has."""
    if isinstance(optimizer, BaseLearningRate):
        return optimizer
    classes = family("optimizer")
    if optimizer not in classes:
        raise ValueError(f"optimizer={optimizer!r} is not supported by training_step; choose an optimizer instance "
                         f"or one of {names('optimizer')}")
    accepted = classes[optimizer]._get_param_names()
    if weight_decay and "weight_decay" not in accepted:
        raise ValueError(f"weight_decay={weight_decay} applies to optimizer='adamw' only, not {optimizer!r}")
    given = {"beta1": float(betas[0]), "beta2": float(betas[1]), "epsilon": float(epsilon),
             "weight_decay": float(weight_decay)}
    return classes[optimizer](**{k: v for k, v in given.items() if k in accepted})


def _name_output(e: Emitter, value: str, name: str) -> None:
    """Make the node writing ``value`` write ``name`` instead (and its readers read it), or copy it to ``name``
    when no node of the step writes it (an input passed through)."""
    producer = next((node for node in reversed(e.nodes) if value in node.output), None)
    if producer is None:
        e.op_named("Identity", [value], name)
        return
    producer.output[list(producer.output).index(value)] = name
    for node in e.nodes:
        for i, used in enumerate(node.input):
            if used == value:
                node.input[i] = name
    e.info[name] = e.info.get(value, ValueInfo(TensorProto.FLOAT))


def _update_in_gemm(e: Emitter, weight: str, grad: str) -> bool:
    """When ``grad`` is the only use of a two-input Gemm's output, make that Gemm write ``weight - grad`` itself
    (``C=weight, alpha=-alpha, beta=1``): one node and one weight-sized buffer fewer per step."""
    producer = next((node for node in reversed(e.nodes) if grad in node.output), None)
    if producer is None or producer.op_type != "Gemm" or len(producer.input) != 2:
        return False
    if any(grad in node.input for node in e.nodes):
        return False
    alpha = next((a.f for a in producer.attribute if a.name == "alpha"), 1.0)
    kept = [a for a in producer.attribute if a.name not in ("alpha", "beta")]
    del producer.attribute[:]
    producer.attribute.extend([*kept, helper.make_attribute("alpha", -alpha), helper.make_attribute("beta", 1.0)])
    producer.input.append(weight)
    producer.output[0] = weight + UPDATED
    return True


def _init_type(model: onnx.ModelProto, name: str) -> int:
    return next(i.data_type for i in model.graph.initializer if i.name == name)


def _one_batch_axis(model: onnx.ModelProto, rows: int | None = None) -> onnx.ModelProto:
    new = onnx.ModelProto()
    new.CopyFrom(model)
    inits = {i.name for i in new.graph.initializer}
    for value in new.graph.input:
        tensor = value.type.tensor_type
        if value.name not in inits and tensor.HasField("shape") and tensor.shape.dim:
            dim = tensor.shape.dim[0]
            if not dim.HasField("dim_value"):
                if rows is None:
                    dim.dim_param = "batch"
                else:
                    dim.dim_value = int(rows)
    return new


__all__ = ["LEARNING_RATE", "STEP", "UPDATED", "training_step"]
