"""``add_loss_output``: turn a prediction graph Y = f(W, X) into one that also computes loss(f(W, X), W, y)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Union

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graph import ModelLike, all_names, check_loadable, elem_type, load_model, output_names, shape_of

SCORES = {
    "squared_error": "squared_error",
    "l2": "squared_error",
    "absolute_error": "absolute_error",
    "l1": "absolute_error",
    "elastic": "elastic",
    "log": "log",
}

PenaltySpec = Mapping[str, Union[float, Mapping[str, float]]]


def add_loss_output(
    onx: ModelLike,
    score_name: str = "squared_error",
    loss_name: str = "loss",
    label_name: str = "label",
    weight_name: str | None = None,
    penalty: PenaltySpec | None = None,
    output_index: int | str | None = None,
    l1_weight: float = 0.5,
    l2_weight: float = 0.5,
) -> onnx.ModelProto:
    """Return a copy of ``onx`` with a new input ``label_name`` and a first output ``loss_name``.

    With ``d = prediction - label`` per sample (summed over output columns) and ``w`` the optional per-sample weight
    input ``weight_name`` (1 when absent), the loss is ``mean(w * l)`` where ``l`` is

    - ``'squared_error'`` / ``'l2'``: ``d**2``;
    - ``'absolute_error'`` / ``'l1'``: ``|d|``;
    - ``'elastic'``: ``l1_weight * |d| + l2_weight * d**2``;
    - ``'log'``: binary log loss of a raw score ``s`` (before the sigmoid) and a label in {0, 1},
      ``log(1 + exp(s)) - y * s`` computed without overflow.

    ``penalty`` maps initializer names to ``{'l1': a, 'l2': b}`` (or to ``b`` alone, meaning L2) and adds
    ``a * sum|w| + b * sum(w**2)`` for each. ``output_index`` picks the prediction by position or name (default: the
    only output, or ``raw_score`` when the graph has one). The original outputs are kept after the loss.
    """
    model = load_model(onx)
    check_loadable(model, "onx")
    if score_name not in SCORES:
        raise ValueError(f"score_name={score_name!r} is unknown; choose one of {sorted(SCORES)}")
    score = SCORES[score_name]
    output = _pick_output(model, output_index)
    existing = all_names(model)
    for arg, name in (("loss_name", loss_name), ("label_name", label_name), ("weight_name", weight_name)):
        if name is not None and name in existing:
            raise ValueError(f"{arg}={name!r} collides with a name already in the graph; pick another name")
    if elem_type(model, output) != TensorProto.FLOAT:
        raise ValueError(f"output {output!r} is not float32: only float32 predictions can carry a loss")
    shape = shape_of(model, output)
    if len(shape) > 2:
        raise ValueError(f"output {output!r} has rank {len(shape)}; the loss expects (N,) or (N, k)")
    if score == "log" and len(shape) == 2 and shape[1] not in (1, None):
        raise ValueError(
            f"score_name='log' needs the raw score of a binary classifier (shape (N, 1)); output {output!r} has "
            f"shape {shape}. Pick the raw score with output_index (ortflow.to_onnx names it 'raw_score')."
        )

    b = _Builder(prefix=f"{loss_name}_")
    diff = b.node("Sub", [output, label_name])
    if score == "squared_error":
        per = b.node("Mul", [diff, diff])
    elif score == "absolute_error":
        per = b.node("Abs", [diff])
    elif score == "elastic":
        sq = b.node("Mul", [diff, diff])
        ab = b.node("Abs", [diff])
        per = b.node("Add", [b.node("Mul", [ab, b.const(l1_weight)]), b.node("Mul", [sq, b.const(l2_weight)])])
    else:  # log: softplus(s) - y*s = relu(s) - y*s + log(1 + exp(-|s|))
        softplus = b.node(
            "Add", [b.node("Relu", [output]), b.node("Log", [b.node("Add", [b.const(1.0), b.node("Exp", [
                b.node("Neg", [b.node("Abs", [output])])])])])]
        )
        per = b.node("Sub", [softplus, b.node("Mul", [label_name, output])])
    if len(shape) == 2:
        per = b.node("ReduceSum", [per, b.const(np.array([1], dtype=np.int64))], keepdims=0)
    if weight_name is not None:
        per = b.node("Mul", [per, weight_name])
    total = b.node("ReduceMean", [per], keepdims=0)
    if penalty:
        total = b.node("Add", [total, _penalty_term(b, model, penalty)])
    b.nodes.append(helper.make_node("Identity", [total], [loss_name]))

    new = onnx.ModelProto()
    new.CopyFrom(model)
    label_shape = ["N"] + [d if isinstance(d, int) and d > 0 else None for d in shape[1:]]
    new.graph.input.append(helper.make_tensor_value_info(label_name, TensorProto.FLOAT, label_shape))
    if weight_name is not None:
        new.graph.input.append(helper.make_tensor_value_info(weight_name, TensorProto.FLOAT, ["N"]))
    new.graph.node.extend(b.nodes)
    old_outputs = list(new.graph.output)
    del new.graph.output[:]
    new.graph.output.append(helper.make_tensor_value_info(loss_name, TensorProto.FLOAT, []))
    new.graph.output.extend(old_outputs)
    onnx.checker.check_model(new)
    return new


def _pick_output(model: onnx.ModelProto, output_index: int | str | None) -> str:
    names = output_names(model)
    if isinstance(output_index, str):
        if output_index not in names:
            raise ValueError(f"output_index={output_index!r} is not an output; outputs are {names}")
        return output_index
    if isinstance(output_index, (int, np.integer)):
        if not -len(names) <= output_index < len(names):
            raise ValueError(f"output_index={output_index} is out of range: the graph has {len(names)} outputs {names}")
        return names[output_index]
    if output_index is not None:
        raise TypeError(f"output_index must be an int, a str or None, not {type(output_index).__name__}")
    if len(names) == 1:
        return names[0]
    if "raw_score" in names:
        return "raw_score"
    raise ValueError(f"the graph has {len(names)} outputs {names}: choose one with output_index")


def _penalty_term(b: "_Builder", model: onnx.ModelProto, penalty: PenaltySpec) -> str:
    floats = {i.name for i in model.graph.initializer if i.data_type == TensorProto.FLOAT}
    terms = []
    for name, coef in penalty.items():
        if name not in floats:
            raise ValueError(f"penalty names {name!r}, which is not a float32 initializer; candidates: {sorted(floats)}")
        if isinstance(coef, Mapping):
            unknown = set(coef) - {"l1", "l2"}
            if unknown:
                raise ValueError(f"penalty[{name!r}] has unknown keys {sorted(unknown)}; use 'l1' and 'l2'")
            l1, l2 = float(coef.get("l1", 0.0)), float(coef.get("l2", 0.0))
        else:
            l1, l2 = 0.0, float(coef)
        if l1:
            terms.append(b.node("Mul", [b.node("ReduceSum", [b.node("Abs", [name])], keepdims=0), b.const(l1)]))
        if l2:
            terms.append(b.node("Mul", [b.node("ReduceSum", [b.node("Mul", [name, name])], keepdims=0), b.const(l2)]))
    if not terms:
        return b.const(0.0)
    return terms[0] if len(terms) == 1 else b.node("Sum", terms)


class _Builder:
    """Appends uniquely named nodes; constants are Constant nodes, so they are never mistaken for weights."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []

    def _name(self, kind: str) -> str:
        return f"{self.prefix}{kind}_{len(self.nodes)}"

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def const(self, value) -> str:
        name = self._name("cst")
        array = np.asarray(value, dtype=np.float32) if not isinstance(value, np.ndarray) else value
        self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array)))
        return name
