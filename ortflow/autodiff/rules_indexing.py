"""Gradient rules of the ops that pick, split, pad or repeat parts of a tensor: Gather, Split, Pad, Tile.

They register into :data:`ortflow.autodiff.rules.RULES` like the rules there. The gradient of a pick adds the
output's gradient back at the picked positions (ScatterND with ``reduction="add"``, opset 16 on): an embedding
row picked twice receives both gradients.
"""

from __future__ import annotations

import numpy as np
import onnx

from ..graph.builder import ValueInfo
from .rules import NodeGrad, _rank, rule


@rule("Gather")
def _gather(n: NodeGrad):
    """``y = data.take(indices, axis)``: the gradient of ``data`` is ``dy`` added at the indexed slices along
    ``axis`` (moved first, so that ScatterND writes whole slices); the indices get none."""
    data, indices = n.x
    e, dy = n.e, n.dy
    if e.opset < 16:
        raise n.refuse("the gradient of Gather needs opset 16 or more (ScatterND with reduction)")
    depth, axis = n.rank(indices), int(n.attr("axis", 0))
    # along the first axis the rank of data is not needed (shape inference may lose it in exported attention)
    rank = n.rank(data) if axis else _rank(e, data)
    axis = axis % rank if axis else 0
    if depth == 0:  # a single index: its slice as a batch of one
        dy, depth = e.unsqueeze(dy, [axis]), 1
    if axis:  # the indexed axes first
        front = list(range(axis, axis + depth)) + list(range(axis)) + list(range(axis + depth, rank - 1 + depth))
        dy = e.op("Transpose", [dy], perm=front)
        first = [axis] + [a for a in range(rank) if a != axis]  # data's axes with the gathered one first
        static = e.static_shape(data)
        shape = e.ints([static[a] for a in first]) if static else e.op("Gather", [e.shape(data), e.ints(first)])
    else:
        shape = e.shape(data)
    rest = e.op("Slice", [shape, e.ints([1]), e.ints([np.iinfo(np.int64).max])])
    updates = e.op("Reshape", [dy, e.op("Concat", [e.ints([-1]), rest], axis=0)])
    flat = e.op("Reshape", [indices, e.ints([-1, 1])])
    if e.dtype(indices) != onnx.TensorProto.INT64:
        flat = e.op("Cast", [flat], to=onnx.TensorProto.INT64)
    size = e.op("Slice", [shape, e.ints([0]), e.ints([1])])
    negative = e.op("Cast", [e.op("Less", [flat, e.ints([0])])], to=onnx.TensorProto.INT64)
    flat = e.op("Add", [flat, e.op("Mul", [negative, size])])  # ScatterND wants indices from 0
    zero = np.zeros((1,), dtype=onnx.helper.tensor_dtype_to_np_dtype(e.dtype(data)))
    zeros = e.op("ConstantOfShape", [shape], value=onnx.numpy_helper.from_array(zero))
    grad = e.op("ScatterND", [zeros, flat, updates], reduction="add")
    if axis:
        back = [first.index(a) for a in range(rank)]
        grad = e.op("Transpose", [grad], perm=back)
    e.info[grad] = e.info.get(data, ValueInfo())
    return [grad, None]


@rule("Split")
def _split(n: NodeGrad):
    """The outputs' gradients joined again along ``axis`` (zeros for an output no gradient reaches)."""
    e = n.e
    parts = [dy if dy is not None else e.zeros_like(out) for dy, out in zip(n.dys, n.node.output)]
    grad = e.op("Concat", parts, like=n.x[0], axis=int(n.attr("axis", 0)))
    return [grad] + [None] * (len(n.x) - 1)


@rule("Pad")
def _pad(n: NodeGrad):
    """Constant padding, seen as a crop by the negative pads then a pad by the positive ones: the gradient pads
    ``dy`` with zeros where the forward pass cropped, then cuts off what it padded."""
    e = n.e
    mode = n.attr("mode", b"constant")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "constant":
        raise n.refuse(f"only mode='constant' is supported (mode={mode!r})")
    if e.opset < 11:
        raise n.refuse("the gradient of Pad needs opset 11 or more (pads as an input)")
    if len(n.needs) > 2 and n.needs[2]:
        raise n.refuse("the padding value must not depend on a differentiated value")
    x, pads = n.x[:2]
    rank = n.rank(x)
    axes = n.x[3] if len(n.x) > 3 and n.x[3] else e.ints(list(range(rank)))
    count = e.op("Shape", [axes])  # how many axes the pads cover: pads holds the starts, then the ends
    zero = e.ints([0])
    cropped = e.op("Max", [e.op("Neg", [pads]), zero])
    grad = e.op("Pad", [n.dy, cropped, "", axes])
    starts = e.op("Slice", [e.op("Max", [pads, zero]), zero, count])
    ends = e.op("Add", [starts, e.op("Gather", [e.shape(x), axes])])
    grad = e.op("Slice", [grad, starts, ends, axes], like=x)
    return [grad] + [None] * (len(n.x) - 1)


@rule("Tile")
def _tile(n: NodeGrad):
    """``dy`` of shape ``(r0 * d0, r1 * d1, ...)`` seen as ``(r0, d0, r1, d1, ...)`` and summed over the
    repetitions."""
    x, repeats = n.x
    e = n.e
    rank = n.rank(x)
    pairs = e.op("Concat", [e.unsqueeze(repeats, [1]), e.unsqueeze(e.shape(x), [1])], axis=1)
    split = e.op("Reshape", [n.dy, e.op("Reshape", [pairs, e.ints([-1])])])
    grad = e.reduce_sum(split, list(range(0, 2 * rank, 2)), keepdims=False)
    e.info[grad] = e.info[x]
    return [grad, None]
