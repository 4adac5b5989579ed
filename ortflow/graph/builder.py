"""The one ONNX node writer: :class:`Emitter` appends uniquely named nodes and typed constants (gradient graphs,
the optimizers' rules in step graphs) and knows the opset-dependent spellings (ReduceSum/Unsqueeze take their axes as
an attribute before opset 13, as an input from 13 on); :class:`GraphBuilder` is an Emitter that also declares the
inputs and outputs of a small graph of its own and wraps it into a model (losses, penalties, updates).

Also the one broadcasting helper every elementwise gradient rule uses: :meth:`Emitter.unbroadcast` sums a gradient
of the broadcast result back to an operand's shape, statically when the shapes settle it, with a run-time
computation of the summed axes otherwise (e.g. ``(N, 1) - (M, 1)`` with two symbolic batch dimensions).
Constants are ``Constant`` nodes, never initializers, so they are never mistaken for weights to train.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..exceptions import NotDifferentiableError

#: The opset of the graphs ortflow writes (onnxruntime-training 1.19.2 reads up to 21).
DEFAULT_OPSET = 17


@dataclass
class ValueInfo:
    """Element type and shape (ints, symbols or None per axis; None when the rank is unknown) of a tensor, and
    the value of the small integer constants."""

    elem_type: int = 0
    shape: list | None = None
    value: np.ndarray | None = None  # for small integer constants (axes, shapes)


@dataclass
class Emitter:
    """Appends uniquely named nodes in the default domain at ``opset``; ``info`` holds what is known of each value
    (the forward values and, filled in by the rules, the gradients)."""

    opset: int
    taken: set
    info: dict = field(default_factory=dict)
    nodes: list = field(default_factory=list)
    prefix: str = "grad"

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name

    def op(self, op_type: str, inputs: Sequence[str], like: str | None = None, **attrs) -> str:
        """One node with one output; the output gets the element type and shape of ``like`` when given."""
        out = self.op_named(op_type, inputs, self.fresh(f"{self.prefix}_{op_type.lower()}"), **attrs)
        if like is not None and like in self.info:
            self.info[out] = self.info[like]
        return out

    def op_named(self, op_type: str, inputs: Sequence[str], output: str, **attrs) -> str:
        """One node writing ``output`` (a name the caller reserved)."""
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=self.fresh(f"{output}_node"),
                                           **attrs))
        return output

    def dtype(self, name: str) -> int:
        elem = self.info.get(name, ValueInfo()).elem_type
        return elem or TensorProto.FLOAT

    def const(self, value, *, like: str | None = None, dtype: int | None = None) -> str:
        """A Constant node holding ``value`` with the element type of ``like`` (or ``dtype``)."""
        elem = dtype if dtype is not None else self.dtype(like)
        array = np.ascontiguousarray(value, dtype=np.dtype(helper.tensor_dtype_to_np_dtype(elem)).newbyteorder("<"))
        return self._constant(array, elem)

    def _constant(self, array: np.ndarray, elem: int) -> str:
        out = self.fresh(f"{self.prefix}_cst")
        # the TensorProto written directly: numpy_helper.from_array's dtype checks cost ~0.3 ms per constant
        tensor = onnx.TensorProto(data_type=elem, dims=array.shape, raw_data=array.tobytes())
        self.nodes.append(helper.make_node("Constant", [], [out], name=self.fresh(f"{out}_node"), value=tensor))
        self.info[out] = ValueInfo(elem, list(array.shape))
        return out

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.asarray(values, dtype=np.int64), dtype=TensorProto.INT64)

    def reduce_sum(self, x: str, axes: Sequence[int] | str, keepdims: bool) -> str:
        """``ReduceSum`` of ``x`` over ``axes`` (a list, or the name of an int64 tensor from opset 13)."""
        if self.opset >= 13:
            axes_in = axes if isinstance(axes, str) else self.ints(axes)
            return self.op("ReduceSum", [x, axes_in], keepdims=int(keepdims), noop_with_empty_axes=1)
        if isinstance(axes, str):
            raise NotDifferentiableError(f"summing over run-time axes needs opset 13 or more (the graph has "
                                         f"opset {self.opset})")
        return self.op("ReduceSum", [x], axes=list(axes), keepdims=int(keepdims))

    def unsqueeze(self, x: str, axes: Sequence[int] | str) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, axes if isinstance(axes, str) else self.ints(axes)])
        if isinstance(axes, str):
            raise NotDifferentiableError(f"run-time Unsqueeze axes need opset 13 or more (opset {self.opset})")
        return self.op("Unsqueeze", [x], axes=list(axes))

    def static_shape(self, x: str) -> list[int] | None:
        """``x``'s shape when every axis has a fixed size, else None."""
        shape = self.info.get(x, ValueInfo()).shape
        if shape is None or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            return None
        return list(shape)

    def shape(self, x: str) -> str:
        """``x``'s shape as an int64 tensor: a constant when it is static, else a ``Shape`` node."""
        static = self.static_shape(x)
        return self.ints(static) if static is not None else self.op("Shape", [x])

    def zeros_like(self, x: str) -> str:
        zero = numpy_helper.from_array(np.zeros((1,), dtype=helper.tensor_dtype_to_np_dtype(self.dtype(x))))
        return self.op("ConstantOfShape", [self.shape(x)], like=x, value=zero)

    def unbroadcast(self, grad: str, operand: str, result: str, operands: Sequence[str]) -> str:
        """``grad`` (shaped like ``result``, the broadcast of ``operands``) summed back to ``operand``'s shape."""
        shape, out = self.info.get(operand, ValueInfo()).shape, self.info.get(result, ValueInfo()).shape
        if shape is None or out is None or len(out) < len(shape):
            return self.unbroadcast_at_run_time(grad, operand)
        lead = len(out) - len(shape)
        others = [self.info.get(o, ValueInfo()).shape for o in operands if o != operand]
        kept = []
        for i, dim in enumerate(shape):
            if dim == 1:
                if out[i + lead] != 1:
                    kept.append(i + lead)
            elif not (isinstance(dim, int) and dim > 1 or _others_follow(dim, i - len(shape), others)):
                return self.unbroadcast_at_run_time(grad, operand)
        if kept:
            grad = self.reduce_sum(grad, kept, keepdims=True)
        if lead == 1 and len(out) == 2 and not kept and isinstance(out[0], int) and self.dtype(grad) in _MATMUL_SUM:
            # a bias's gradient, (N, k) summed over its rows: as ones(N) @ grad, which onnxruntime's CPU computes
            # ~20x faster than a ReduceSum over the first axis at 256 x 256
            ones = self.const(np.ones(out[0]), dtype=self.dtype(grad))
            grad = self.op("MatMul", [ones, grad])
        elif lead:
            grad = self.reduce_sum(grad, list(range(lead)), keepdims=False)
        if kept or lead:
            self.info[grad] = self.info.get(operand, ValueInfo())
        return grad

    def unbroadcast_batch(self, grad: str, operand: str, result: str) -> str:
        """A batched ``MatMul``'s ``grad`` for ``operand`` (shaped like ``result`` but for its last two axes, which
        are ``operand``'s own) summed over the batch axes ``operand`` was broadcast along. Decided from the shapes
        when every batch axis of ``operand`` is settled: a fixed size other than 1, a 1 where ``result`` has a
        fixed size, or the same symbol as ``result``'s (then equal at run time: no sum); else at run time."""
        shape, out = self.info.get(operand, ValueInfo()).shape, self.info.get(result, ValueInfo()).shape
        if shape is None or out is None or len(out) < len(shape) or len(shape) < 2:
            return self.unbroadcast_at_run_time(grad, operand)
        lead = len(out) - len(shape)
        kept = []
        for i, dim in enumerate(shape[:-2]):
            other = out[i + lead]
            if dim == 1 and isinstance(other, int):
                if other != 1:
                    kept.append(i + lead)
            elif not (isinstance(dim, int) and dim > 1 or dim is not None and dim == other):
                return self.unbroadcast_at_run_time(grad, operand)
        if kept:
            grad = self.reduce_sum(grad, kept, keepdims=True)
        if lead:
            grad = self.reduce_sum(grad, list(range(lead)), keepdims=False)
        self.info[grad] = self.info.get(operand, ValueInfo())
        return grad

    def unbroadcast_at_run_time(self, grad: str, operand: str) -> str:
        """Sum over the axes where the (left-padded) operand shape differs from the gradient's, found at run time."""
        shape = self.shape(operand)
        grad_shape = self.shape(grad)
        # ranks as 1-element Shape-of-Shape tensors: onnxruntime 1.32's shape inference mis-sizes the padding when
        # they come from Size
        rank_gap = self.op("Sub", [self.op("Shape", [grad_shape]), self.op("Shape", [shape])])
        ones = self.op("Expand", [self.ints([1]), rank_gap])
        padded = self.op("Concat", [ones, shape], axis=0)
        differs = self.op("Not", [self.op("Equal", [padded, grad_shape])])
        axes = self.op("Reshape", [self.op("NonZero", [differs]), self.ints([-1])])
        summed = self.reduce_sum(grad, axes, keepdims=True)
        return self.op("Reshape", [summed, shape], like=operand)


#: element types whose row sums :meth:`Emitter.unbroadcast` computes with MatMul
_MATMUL_SUM = (TensorProto.FLOAT, TensorProto.DOUBLE)


def _others_follow(dim, axis_from_end: int, others: list) -> bool:
    """True when every other operand is 1 (or absent) at that axis, or has the same symbol: the result's axis is
    then ``dim`` itself, so no sum is needed. Unknown dims (None) prove nothing."""
    if dim is None:
        return all(s is not None and (len(s) < -axis_from_end or s[axis_from_end] == 1) for s in others)
    for s in others:
        if s is None:
            return False
        if len(s) >= -axis_from_end and s[axis_from_end] not in (1, dim):
            return False
    return True


def _inferred(model: onnx.ModelProto) -> onnx.GraphProto:
    """``model``'s graph after onnx's shape inference with data propagation (a shape computed from ``Shape``,
    ``Gather``, ``Concat``... feeding a ``Reshape``, as exported attention writes it, becomes the shape it is),
    without it if that fails, else as declared (an op onnx does not know)."""
    for data_prop in (True, False):
        try:
            return onnx.shape_inference.infer_shapes(model, data_prop=data_prop).graph
        except Exception:  # noqa: BLE001 - the next, weaker inference
            continue
    return model.graph


def value_infos(model: onnx.ModelProto) -> dict[str, ValueInfo]:
    """Element type and shape of every tensor of the main graph, from onnx's shape inference. Unnamed dims of the
    graph inputs get a symbol of their own first, so that inference carries them (``X``'s batch axis stays the
    same symbol through MatMul and Add)."""
    named = onnx.ModelProto()
    named.CopyFrom(model)
    for value in named.graph.input:
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            for i, dim in enumerate(value.type.tensor_type.shape.dim):
                if not dim.HasField("dim_value") and not dim.dim_param:
                    dim.dim_param = f"{value.name}__dim{i}"
    graph = _inferred(named)
    infos = {}
    for init in graph.initializer:
        infos[init.name] = ValueInfo(init.data_type, list(init.dims), _small_ints(init))
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for att in node.attribute:
                if att.name == "value":
                    infos[node.output[0]] = ValueInfo(att.t.data_type, list(att.t.dims), _small_ints(att.t))
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        if not value.type.HasField("tensor_type"):
            continue
        tensor = value.type.tensor_type
        shape = None
        if tensor.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
        if value.name not in infos or tensor.elem_type:
            infos[value.name] = ValueInfo(tensor.elem_type, shape, infos.get(value.name, ValueInfo()).value)
    return infos


def _small_ints(tensor: onnx.TensorProto) -> np.ndarray | None:
    if tensor.data_type != TensorProto.INT64 or np.prod(tensor.dims, dtype=np.int64) > 64:
        return None
    return numpy_helper.to_array(tensor)


class GraphBuilder(Emitter):
    """An :class:`Emitter` writing a small graph of its own: declared inputs and outputs, ``model`` wraps them."""

    def __init__(self, prefix: str = "n", opset: int = DEFAULT_OPSET, taken: set | None = None):
        super().__init__(opset=opset, taken=set(taken or ()), prefix=prefix)
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._renamed: dict[str, str] = {}

    def input(self, name: str, shape: Sequence | None = None, elem_type: int = TensorProto.FLOAT) -> str:
        self.taken.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, None if shape is None else list(shape)))
        self.info[name] = ValueInfo(elem_type, None if shape is None else list(shape))
        return name

    def output(self, value: str, name: str, shape: Sequence | None = None) -> str:
        """Make ``value`` a graph output called ``name``: its producing node is renamed (no Identity copy) unless
        it is a graph input or already an output."""
        value = self._renamed.get(value, value)
        producer = next((n for n in self.nodes if value in n.output), None)
        if producer is None or any(o.name == value for o in self.outputs):
            self.op_named("Identity", [value], name)
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
        """One node with one output (:meth:`Emitter.op`)."""
        return self.op(op, inputs, **attrs)

    def const(self, value, *, like: str | None = None, dtype=np.float32) -> str:
        """A Constant node holding ``value`` with its own shape (a number is a scalar), of numpy ``dtype``
        (``'int64'`` for shapes and axes) or an ONNX element type, or the type of ``like``."""
        if like is not None:
            dtype = self.dtype(like)
        elem = int(dtype) if isinstance(dtype, (int, np.integer)) else helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        array = np.asarray(value, dtype=np.dtype(helper.tensor_dtype_to_np_dtype(elem)).newbyteorder("<"))
        return self._constant(array, elem)

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
