"""The frozen prefix of a graph: the nodes no trained weight reaches, computed once per row instead of per step.

A scikit-learn Pipeline's preprocessing (a ``ColumnTransformer`` with encoders, imputers, scalers) and the frozen
layers of a fine-tuned network sit between the data inputs and the first trained weight. Their outputs do not change
while training, so :class:`FrozenPrefix` cuts the graph there: the prefix runs in a plain ``InferenceSession``
when the data is prepared (it takes text and any input type a session takes), and the trainers train the rest, the
*trainable part*, whose inputs are the cut tensors. The trained weights are the same initializers in both graphs,
so the trainer still predicts with the whole graph.

Nodes that draw random numbers (``Dropout``, ``Random*``) and nodes holding subgraphs are never in the prefix.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import helper

from ..graph import editing as g
from .._ort import InferenceSession
from .sessions import make_session_options

#: ops left in the trainable part even when no trained weight reaches them (their value changes per run)
_PER_RUN = frozenset({"Dropout", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                      "Bernoulli", "Multinomial"})


class FrozenPrefix:
    """The prefix session of a graph cut at ``cut`` (the tensors the trainable part reads)."""

    def __init__(self, prefix: onnx.ModelProto, cut: list[str]):
        self.model = prefix
        self.cut = list(cut)
        self.input_names = g.input_names(prefix)
        self.row_bytes, self.row_shapes = 0, {}  # the size of one row of the cut (known after a first run)
        # onnxruntime types the outputs itself (shape inference does not know every ai.onnx.ml op)
        self._session = InferenceSession(prefix.SerializeToString(), make_session_options(),
                                         providers=["CPUExecutionProvider"])

    @classmethod
    def split(cls, model: onnx.ModelProto, weights: Iterable[str], data_inputs: Iterable[str],
              outputs: Iterable[str], sample: dict[str, np.ndarray],
              not_per_row: frozenset = frozenset()) -> tuple[onnx.ModelProto, FrozenPrefix | None]:
        """``(trainable part, prefix)`` of ``model`` computing ``outputs`` with ``weights`` trained, the cut
        tensors typed from a run of the prefix on ``sample`` (a few rows of the data inputs' feeds); ``(model, None)``
        when every node is reached by a trained weight (nothing to cut).

        Only tensors with one row per data row can be cut (the trainer copies their rows batch by batch): a tensor
        the prefix computes whose first axis does not follow the rows (a shape, ``Shape(X) * 2``, a reduction over
        the rows) is computed by the trainable part instead (``not_per_row`` holds those found so far)."""
        model = g.keep_outputs(model, list(outputs))
        weights, data_inputs = set(weights), set(data_inputs)
        constant = {i.name for i in model.graph.initializer if i.name not in weights} | {""}
        frozen = set(constant) | data_inputs
        prefix_nodes, trainable_nodes, constant_nodes = [], [], []
        nodes = list(model.graph.node)  # the same node objects throughout: _place_constant_nodes compares their ids
        for node in nodes:
            fixed = (node.op_type not in _PER_RUN and not any(a.type in (onnx.AttributeProto.GRAPH,
                     onnx.AttributeProto.GRAPHS) for a in node.attribute))
            if fixed and any(o in not_per_row for o in node.output):
                trainable_nodes.append(node)
            elif fixed and all(i in constant for i in node.input):
                constant.update(node.output)  # computed from constants only: goes where it is used (below)
                frozen.update(node.output)
                constant_nodes.append(node)
            elif fixed and all(i in frozen for i in node.input):
                frozen.update(node.output)
                prefix_nodes.append(node)
            else:
                trainable_nodes.append(node)
        prefix_nodes, trainable_nodes = _place_constant_nodes(nodes, constant_nodes, prefix_nodes,
                                                              trainable_nodes, [o.name for o in model.graph.output])
        cut = []
        for node in trainable_nodes:
            for name in node.input:
                if name in frozen and name not in constant and name not in cut:
                    cut.append(name)
        if not prefix_nodes or set(cut) <= data_inputs:
            return model, None
        if any(o.name in frozen for o in model.graph.output):
            return model, None  # an output no trained weight reaches: nothing to train through it
        prefix_graph = helper.make_graph(
            prefix_nodes,
            f"{model.graph.name}_frozen_prefix",
            [i for i in model.graph.input if i.name in data_inputs],
            [onnx.ValueInfoProto(name=name) for name in cut],
            [i for i in model.graph.initializer if i.name in constant],
        )
        prefix = helper.make_model(prefix_graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
        prefix = g.keep_outputs(prefix, cut)
        frozen_prefix = cls(prefix, cut)
        values = frozen_prefix.transform({k: v[:2] for k, v in sample.items()})
        rows = len(next(iter(sample.values())))
        one = frozen_prefix.transform({k: v[:1] for k, v in sample.items()}) if rows > 1 else values
        whole = [name for name in cut if np.ndim(values[name]) == 0 or len(values[name]) != min(rows, 2)
                 or np.ndim(one[name]) == 0 or len(one[name]) != 1]
        if whole:
            return cls.split(model, weights, data_inputs, outputs, sample, not_per_row | frozenset(whole))
        frozen_prefix.row_shapes = {name: v.shape[1:] for name, v in values.items()}
        frozen_prefix.row_bytes = sum(v[:1].nbytes for v in values.values())
        types = {name: helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype),
                                                     ["N", *v.shape[1:]]) for name, v in values.items()}
        kept_inputs = [i for i in model.graph.input if i.name not in data_inputs]
        trainable = helper.make_graph(
            trainable_nodes,
            model.graph.name,
            [types[name] for name in cut] + kept_inputs,
            list(model.graph.output),
            list(model.graph.initializer),
            value_info=[v for v in model.graph.value_info if v.name not in cut],
        )
        part = helper.make_model(trainable, opset_imports=list(model.opset_import), ir_version=model.ir_version)
        part.metadata_props.extend(model.metadata_props)
        part = _drop_unused_initializers(part)
        return part, frozen_prefix

    def transform(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The trainable part's feeds (the cut tensors) for the data inputs' ``feeds``; refused, before any
        work, when they would take more than half the memory available (a one-hot encoder of 10^5 categories
        writes 10^5 dense columns per row)."""
        rows = len(next(iter(feeds.values())))
        if self.row_bytes and rows * self.row_bytes > _available_bytes() / 2:
            widths = {name: int(np.prod(shape)) for name, shape in self.row_shapes.items()}
            raise MemoryError(
                f"the frozen prefix (the graph's preprocessing) turns {rows} rows into {widths} values per row, "
                f"{rows * self.row_bytes / 2**30:.1f} GiB, more than half the memory available: fewer columns "
                "(OneHotEncoder(max_categories=...) or OrdinalEncoder for a column of many levels), or stream the "
                "rows (ortflow.data.sources) so that only a chunk is transformed at a time")
        values = self._session.run(self.cut, {name: feeds[name] for name in self.input_names})
        return {name: np.ascontiguousarray(v) for name, v in zip(self.cut, values)}


def _place_constant_nodes(nodes, constant_nodes, prefix_nodes, trainable_nodes, outputs):
    """Each node computed from constants only (a ``Constant``, a shape computed from initializers) joins the part
    that reads it, both when both do (the trainable part keeps those no one reads); each part keeps the graph's
    node order."""
    needed = {"prefix": {n for node in prefix_nodes for n in node.input},
              "trainable": {n for node in trainable_nodes for n in node.input} | set(outputs)}
    placed = {"prefix": {id(n) for n in prefix_nodes}, "trainable": {id(n) for n in trainable_nodes}}
    for node in reversed(constant_nodes):  # a constant node may read another: walk back, adding what it reads
        parts = [p for p in ("prefix", "trainable") if needed[p] & set(node.output)] or ["trainable"]
        for part in parts:
            placed[part].add(id(node))
            needed[part].update(node.input)
    return ([n for n in nodes if id(n) in placed["prefix"]], [n for n in nodes if id(n) in placed["trainable"]])


def _drop_unused_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    used = {n for node in model.graph.node for n in node.input} | {o.name for o in model.graph.output}
    kept = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


def _available_bytes() -> float:
    """Memory available to the process (Linux: MemAvailable; elsewhere unknown, so no limit)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")

