"""Reverse-mode differentiation of an ONNX graph into standard ONNX nodes.

1. Forward, in graph order: a value is *active* when it is float and depends on a source (a weight or input
   whose gradient is asked for) through ops that carry gradients (not :data:`~ortflow.autodiff.rules.NO_GRADIENT`).
2. Backward from the target: a value is *needed* when the target depends on it. The nodes with an output both
   active and needed lie on the path; each must have a rule (else :class:`NotDifferentiableError`).
3. In reverse graph order, each node on the path turns the gradient of its outputs into gradients of its active
   inputs (its rule); a value used several times receives one contribution per use, added with ``Sum`` the first
   time a rule (or the caller) reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from ..exceptions import NotDifferentiableError
from ..graph.editing import FLOAT_TYPES, all_names
from ..graph.builder import Emitter, ValueInfo, value_infos
from . import rules_indexing, rules_nn  # noqa: F401 - the rule families of their own modules register into RULES
from .rules import NO_GRADIENT, RULES, NodeGrad, node_label

DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass
class Gradients:
    """The result of :func:`build_gradients`: ``grads`` (source -> name of its gradient, or None when the target
    does not depend on it) and the emitter that wrote the nodes (``emitter.nodes``, to append after the forward
    nodes; ``emitter.info``, type and shape by name; use it to add more nodes with fresh names)."""

    grads: dict
    emitter: Emitter

    @property
    def nodes(self) -> list:
        return self.emitter.nodes


def opset_of(model: onnx.ModelProto) -> int:
    for opset in model.opset_import:
        if opset.domain in DEFAULT_DOMAINS:
            return opset.version
    raise ValueError("the model imports no default-domain opset")


def build_gradients(
    model: onnx.ModelProto, sources: Sequence[str], target: str | Sequence[str],
    seed: str | None | Sequence[str | None] = None, taken: set | None = None
) -> Gradients:
    """Nodes computing the gradient of ``target`` with respect to each of ``sources`` (initializers or inputs).

    ``seed`` names the tensor holding the gradient flowing into ``target`` (shaped like it); without one it is
    ones (the gradient of ``sum(target)``, of the target itself when it is a scalar). Several targets (a list, with
    a list of seeds) give the gradient of the sum of their seeded products. ``taken`` holds names the new nodes
    must avoid besides the graph's own.
    """
    targets = [target] if isinstance(target, str) else list(target)
    seeds = [seed] * len(targets) if seed is None or isinstance(seed, str) else list(seed)
    if len(seeds) != len(targets):
        raise ValueError(f"build_gradients: {len(targets)} targets {targets} but {len(seeds)} seeds")
    info = value_infos(model)
    for name in targets:
        if name not in info:
            raise ValueError(f"{name!r} is not a value of the graph")
        if info[name].elem_type not in FLOAT_TYPES:
            raise ValueError(f"{name!r} is not a float tensor: it has no gradient")
    e = Emitter(opset_of(model), all_names(model) | {n.name for n in model.graph.node} | set(taken or ()), info)
    nodes = list(model.graph.node)
    active = _active(nodes, set(sources), info)
    path = _on_path(nodes, active, targets)
    missing = _without_rule(nodes, path)
    if missing:
        shown = targets[0] if len(targets) == 1 else targets
        verb = "has no gradient rule but lies" if len(missing) == 1 else "have no gradient rule but lie"
        raise NotDifferentiableError(
            f"{', '.join(missing)} {verb} between {shown!r} and a differentiated weight or input: leave those "
            "weights out, or add a rule in ortflow/autodiff/rules.py")
    contributions: dict[str, list[str]] = {}
    for name, value in zip(targets, seeds):
        contributions.setdefault(name, []).append(value if value is not None else _ones(e, name))
    for index in reversed(path):
        node = nodes[index]
        dys = [_total(e, contributions, out) for out in node.output]
        if all(dy is None for dy in dys):
            continue
        needs = [bool(x) and x in active for x in node.input]
        grads = RULES[node.op_type](NodeGrad(node, index, dys, needs, e))
        for x, need, grad in zip(node.input, needs, grads):
            if need and grad is not None:
                contributions.setdefault(x, []).append(grad)
    grads = {s: _total(e, contributions, s) for s in sources}
    return Gradients(grads, e)


def nodes_without_rule(model: onnx.ModelProto, sources: Sequence[str], target: str | Sequence[str]) -> list[str]:
    """Every node on the way from ``sources`` to ``target`` that has no gradient rule, as ``"node 'name' (op
    Type)"`` in graph order: empty when :func:`build_gradients` can differentiate the graph."""
    targets = [target] if isinstance(target, str) else list(target)
    nodes = list(model.graph.node)
    return _without_rule(nodes, _on_path(nodes, _active(nodes, set(sources), value_infos(model)), targets))


def _without_rule(nodes: list, path: list[int]) -> list[str]:
    missing = []
    for index in path:
        node = nodes[index]
        if node.domain not in DEFAULT_DOMAINS or node.op_type not in RULES:
            op = f"{node.domain}.{node.op_type}" if node.domain not in DEFAULT_DOMAINS else node.op_type
            missing.append(f"node {node_label(node, index)!r} (op {op})")
    return missing


def refuse_unreached(model: onnx.ModelProto, weights: list[str], loss: str) -> None:
    """A trained weight the loss depends on through ops without gradient only (Floor, Sign...) would never move:
    :class:`NotDifferentiableError` naming the first such node between it and the loss."""
    if not weights:
        return
    nodes = list(model.graph.node)
    reached, needed = set(weights), {loss}
    for node in nodes:
        if reached.intersection(node.input):
            reached.update(node.output)
    for node in reversed(nodes):
        if needed.intersection(node.output):
            needed.update(node.input)
    for index, node in enumerate(nodes):
        if node.op_type in NO_GRADIENT and reached.intersection(node.input) and needed.intersection(node.output):
            raise NotDifferentiableError(
                f"node {node_label(node, index)!r} (op {node.op_type}) has no gradient but lies between {loss!r} "
                f"and the trained weights {weights}: they would never change; leave them out of the trained weights")
    raise NotDifferentiableError(f"the trained weights {weights} get no gradient from {loss!r}")


def unreached(model: onnx.ModelProto, sources: Sequence[str], target: str) -> list[str]:
    """The ``sources`` that ``target`` does not depend on through ops carrying gradients."""
    info, nodes = value_infos(model), list(model.graph.node)
    return [s for s in sources if target not in _active(nodes, {s}, info)]


def _active(nodes: list, sources: set, info: dict) -> set:
    active = set(sources)
    for node in nodes:
        if node.op_type in NO_GRADIENT and node.domain in DEFAULT_DOMAINS:
            continue
        if active.intersection(node.input) or active.intersection(_implicit_inputs(node)):
            # an output of unknown type (an op onnx cannot infer) counts as float: better refused than ignored
            active.update(o for o in node.output if o and info.get(o, ValueInfo()).elem_type in FLOAT_TYPES + (0,))
    return active


def _on_path(nodes: list, active: set, targets: Sequence[str]) -> list[int]:
    """Indices, in graph order, of the nodes with an output both active and needed by ``targets``."""
    needed = set(targets)
    path = []
    for index in range(len(nodes) - 1, -1, -1):
        node = nodes[index]
        if needed.intersection(node.output):
            needed.update(node.input)
            needed.update(_implicit_inputs(node))
            if any(o in needed and o in active for o in node.output):
                path.append(index)
    return path[::-1]


def _implicit_inputs(node: onnx.NodeProto) -> set:
    """Names a node's subgraphs (If/Loop/Scan bodies) read from the enclosing graph."""
    names = set()
    for att in node.attribute:
        if att.type == onnx.AttributeProto.GRAPH:
            names |= all_names(onnx.helper.make_model(att.g))
        elif att.type == onnx.AttributeProto.GRAPHS:
            for sub in att.graphs:
                names |= all_names(onnx.helper.make_model(sub))
    return names


def _total(e: Emitter, contributions: dict, name: str) -> str | None:
    """The gradient of ``name``: its single contribution, or their Sum (stored back as the only one)."""
    parts = contributions.get(name)
    if not parts:
        return None
    if len(parts) > 1:
        parts[:] = [e.op("Sum", parts, like=name)]
    return parts[0]


def _ones(e: Emitter, target: str) -> str:
    shape = e.info[target].shape
    if shape is not None and all(isinstance(d, int) for d in shape):
        return e.const(np.ones(shape), like=target)
    one = onnx.numpy_helper.from_array(np.ones((1,), dtype=onnx.helper.tensor_dtype_to_np_dtype(e.dtype(target))))
    return e.op("ConstantOfShape", [e.shape(target)], like=target, value=one)
