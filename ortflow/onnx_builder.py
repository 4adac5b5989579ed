"""``GraphBuilder``: writes the small float graphs ortflow adds or runs (losses, penalties, updates).

Every node gets a unique name (its output's), so an error from onnxruntime names the node; constants are
``Constant`` nodes, never initializers, so they are never mistaken for weights to train.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: The opset of the graphs ortflow writes (onnxruntime-training 1.19.2 reads up to 21).
DEFAULT_OPSET = 17


class GraphBuilder:
    """Appends named nodes; ``model`` wraps them with the declared inputs and outputs into a graph."""

    def __init__(self, prefix: str = "n"):
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._renamed: dict[str, str] = {}

    def input(self, name: str, shape: Sequence | None = None, elem_type: int = TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, None if shape is None else list(shape)))
        return name

    def output(self, value: str, name: str, shape: Sequence | None = None) -> str:
        """Make ``value`` a graph output called ``name``: its producing node is renamed (no Identity copy) unless
        it is a graph input or already an output."""
        value = self._renamed.get(value, value)
        producer = next((n for n in self.nodes if value in n.output), None)
        if producer is None or any(o.name == value for o in self.outputs):
            self.nodes.append(helper.make_node("Identity", [value], [name], name=f"{self.prefix}_{name}"))
        else:
            self._renamed[value] = name
            producer.output[list(producer.output).index(value)] = name
            for node in self.nodes:
                for i, used in enumerate(node.input):
                    if used == value:
                        node.input[i] = name
        dims = None if shape is None else list(shape)
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
        return name

    def node(self, op: str, inputs: Sequence[str], **attrs) -> str:
        out = f"{self.prefix}_{op.lower()}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    def const(self, value, dtype=np.float32) -> str:
        out = f"{self.prefix}_cst_{len(self.nodes)}"
        array = np.asarray(value, dtype=dtype)
        self.nodes.append(helper.make_node("Constant", [], [out], name=out, value=numpy_helper.from_array(array)))
        return out

    def add_all(self, terms: Sequence[str]) -> str:
        """The sum of ``terms`` as a chain of ``Add`` nodes (``Sum`` has no gradient in onnxruntime 1.19)."""
        if not terms:
            return self.const(0.0)
        total = terms[0]
        for term in terms[1:]:
            total = self.node("Add", [total, term])
        return total

    def model(self, opset: int = DEFAULT_OPSET, name: str = "ortflow") -> onnx.ModelProto:
        if opset < 13:
            raise ValueError(f"opset={opset}: ortflow's graphs need opset 13 or more (ReduceSum takes axes as input)")
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
        model.producer_name = "ortflow"
        if all(v.type.tensor_type.HasField("shape") for v in self.inputs + self.outputs):
            onnx.checker.check_model(model)  # the checker refuses inputs of unknown rank, onnxruntime does not
        return model
