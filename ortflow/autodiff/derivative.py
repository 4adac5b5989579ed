"""``onnx_derivative``: the gradient of a model as a standalone ONNX graph (onnxcustom's function of that name)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import helper

from ..graph import editing as graph
from ..graph.editing import (FLOAT_TYPES, ModelLike, all_names, input_names, load_model, output_names,
                             trainable_initializers)
from .builder import Gradients, build_gradients
from ..graph.builder import ValueInfo


def onnx_derivative(
    model: ModelLike,
    weights: Sequence[str] | None = None,
    inputs: bool | Sequence[str] = False,
    output: str | int | None = None,
    fill_grad: bool | None = None,
    keep_outputs: bool = False,
    weights_as_inputs: bool = True,
) -> onnx.ModelProto:
    """A standard-ONNX graph computing the gradient of one output of ``model``.

    - ``weights``: the float initializers to differentiate with respect to (default: all of them; ``[]``: none).
      With ``weights_as_inputs`` (default) they become graph inputs, fed at every run, else they stay
      initializers and the gradient is taken at their stored values.
    - ``inputs``: ``True`` for every float input, or a list of input names, also differentiated.
    - ``output``: the differentiated output, by name or position (default: the first output, the loss of
      :func:`ortflow.add_loss_output`).
    - ``fill_grad``: ``True`` differentiates ``sum(output)`` (the output itself when it is a scalar); ``False`` adds
      an input ``<output>_grad`` shaped like the output that receives the upstream gradient (onnxcustom's
      ``DerivativeOptions.Zero``). Default: ``True`` when the output is declared scalar, else ``False``.
    - ``keep_outputs``: the model's outputs come first among the graph outputs.

    The graph's inputs are the model's inputs, then the weights (when ``weights_as_inputs``), then
    ``<output>_grad``; its outputs (after the kept ones) are ``<name>_grad`` for each differentiated input, then
    each weight, shaped like them (zeros when the output does not depend on it). The graph keeps the model's opset
    and IR version and runs in a plain ``onnxruntime.InferenceSession``. An op on the way without a gradient rule
    raises :class:`ortflow.NotDifferentiableError` naming the node and the op.
    """
    model = load_model(model)
    feeds = input_names(model)
    weights = pick_weights(model, weights)
    diff_inputs = _pick_inputs(model, feeds, inputs)
    target = graph.pick_output(model, output, "output", first=True)
    declared = {v.name: v for v in model.graph.output}[target]
    scalar = declared.type.tensor_type.HasField("shape") and not declared.type.tensor_type.shape.dim
    fill = scalar if fill_grad is None else bool(fill_grad)
    return gradient_graph(model, diff_inputs + weights, [target], [None if fill else f"{target}_grad"],
                          output_names(model) if keep_outputs else [], weights if weights_as_inputs else [])


def gradient_graph(
    model: onnx.ModelProto,
    sources: Sequence[str],
    targets: Sequence[str],
    seeds: Sequence[str | None],
    kept_outputs: Sequence[str],
    weights_as_inputs: Sequence[str],
) -> onnx.ModelProto:
    """The graph of the gradients ``<source>_grad`` of ``targets`` (the sum of their seeded products) with respect
    to each of ``sources``: per target, ``seeds`` names the input receiving its upstream gradient (shaped like it),
    or is None for ones. ``kept_outputs`` and ``weights_as_inputs`` as in :func:`assemble`."""
    grad_names = {s: f"{s}_grad" for s in sources}
    seed_names = [s for s in seeds if s is not None]
    clash = sorted(n for n in [*seed_names, *grad_names.values()] if n in all_names(model))
    if clash:
        raise ValueError(f"ortflow names the gradients <name>_grad, but {clash} already exist in the graph")
    both = [t for t in targets if t in sources]
    if both:
        raise ValueError(f"output {both[0]!r} is also a differentiated input")
    gradients = build_gradients(model, sources, targets, seeds, taken={*seed_names, *grad_names.values()})
    seed_inputs = [value_info(seed, gradients.emitter.info[t]) for t, seed in zip(targets, seeds) if seed is not None]
    return assemble(model, gradients, grad_names, kept_outputs, seed_inputs, weights_as_inputs)


def assemble(
    model: onnx.ModelProto,
    gradients: Gradients,
    grad_outputs: dict[str, str],
    kept_outputs: Sequence[str],
    extra_inputs: Sequence[onnx.ValueInfoProto],
    weights_as_inputs: Sequence[str],
    more_outputs: Sequence[onnx.ValueInfoProto] = (),
) -> onnx.ModelProto:
    """The model's nodes and the emitter's nodes, pruned to what the outputs need: ``kept_outputs`` (outputs of
    the model), the gradients named by ``grad_outputs`` (source -> output name) and ``more_outputs`` (values the
    caller added with the emitter). ``weights_as_inputs`` leave the initializers for the inputs, after the model's
    own inputs; ``extra_inputs`` come last."""
    e = gradients.emitter
    # a source the target does not depend on gets zeros
    grads = {s: gradients.grads[s] or e.zeros_like(s) for s in grad_outputs}
    nodes = list(model.graph.node) + list(e.nodes)
    typed = {v.name: v for v in model.graph.output}
    outputs = [typed[name] if typed[name].type.tensor_type.HasField("shape") else value_info(name, e.info[name])
               for name in kept_outputs]
    for source, out in grad_outputs.items():
        nodes.append(helper.make_node("Identity", [grads[source]], [out], name=e.fresh(f"{out}_output")))
        outputs.append(value_info(out, e.info[source]))
    outputs += list(more_outputs)
    needed = {o.name for o in outputs}
    kept = []
    for node in reversed(nodes):
        if needed.intersection(node.output):
            kept.append(node)
            needed.update(node.input)
    kept.reverse()
    as_inputs = set(weights_as_inputs)
    inits = {i.name for i in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in inits]
    graph_inputs += [value_info(w, e.info[w]) for w in weights_as_inputs] + list(extra_inputs)
    initializers = [i for i in model.graph.initializer if i.name not in as_inputs and i.name in needed]
    graph = helper.make_graph(kept, f"{model.graph.name or 'model'}_gradient", graph_inputs, outputs, initializers)
    new = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    new.producer_name = "ortflow"
    if all(v.type.tensor_type.HasField("shape") for v in list(graph.input) + list(graph.output)):
        onnx.checker.check_model(new)  # the checker refuses values of unknown rank, onnxruntime does not
    return new


def value_info(name: str, info: ValueInfo) -> onnx.ValueInfoProto:
    """A tensor value info named ``name`` with the type and shape of ``info``."""
    return helper.make_tensor_value_info(name, info.elem_type, info.shape)


def pick_weights(model: onnx.ModelProto, weights: Sequence[str] | None) -> list[str]:
    """The float initializers named by ``weights`` (all of them for None), checked."""
    floats = trainable_initializers(model)
    return floats if weights is None else _pick("weights", weights, floats, "float initializers")


def _pick_inputs(model: onnx.ModelProto, feeds: list[str], inputs: bool | Sequence[str]) -> list[str]:
    types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    floats = [f for f in feeds if types.get(f) in FLOAT_TYPES]
    if inputs is True:
        return floats
    if inputs is False or inputs is None:
        return []
    return _pick("inputs", inputs, floats, "float inputs of the graph")


def _pick(argument: str, names: Sequence[str], candidates: list[str], what: str) -> list[str]:
    if isinstance(names, str):
        raise TypeError(f"{argument} must be a list of names, not the string {names!r}")
    unknown = [n for n in names if n not in candidates]
    if unknown:
        raise ValueError(f"{argument} names {unknown}, which are not {what}; candidates: {candidates}")
    return list(dict.fromkeys(names))
