"""Gradient rules of the neural-network layers: convolutions, pooling, batch and layer normalization, dropout.

They register into :data:`ortflow.autodiff.rules.RULES` like the rules there. Convolutions and pools need the
spatial sizes of their input and the kernel's shape to be known (a symbolic batch is fine): the gradients are
themselves convolutions whose paddings follow from those sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from ..graph.builder import Emitter
from .rules import NodeGrad, rule


@dataclass
class Window:
    """The geometry of a convolution or pool over ``len(kernel)`` spatial axes: sizes in and out, explicit
    paddings at the start and the end of each axis."""

    sizes: list
    kernel: list
    strides: list
    dilations: list
    begins: list
    ends: list
    outs: list

    @property
    def spans(self) -> list:
        """The extent of each dilated kernel."""
        return [(k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations)]

    def leftovers(self) -> list:
        """Per axis, the input positions past the last window (a stride that does not divide the padded size)."""
        return [size + b + e - span - (out - 1) * s
                for size, b, e, span, out, s in zip(self.sizes, self.begins, self.ends, self.spans, self.outs,
                                                    self.strides)]


def _window(n: NodeGrad, x: str, kernel: list | None = None) -> Window:
    shape = n.e.info[x].shape if x in n.e.info else None
    if shape is None or not all(isinstance(d, int) for d in shape[2:]):
        raise n.refuse(f"the spatial sizes of {x!r} must be known (they are {shape and shape[2:]})")
    sizes = list(shape[2:])
    dims = len(sizes)
    kernel = kernel or list(n.attr("kernel_shape"))
    strides = list(n.attr("strides", [1] * dims))
    dilations = list(n.attr("dilations", [1] * dims))
    auto_pad = n.attr("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    ceil = bool(n.attr("ceil_mode", 0))
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        outs = [-(-size // s) for size, s in zip(sizes, strides)]
        totals = [max(0, (o - 1) * s + span - size) for o, s, span, size in zip(outs, strides, spans, sizes)]
        small = [t // 2 for t in totals]
        begins = small if auto_pad == "SAME_UPPER" else [t - h for t, h in zip(totals, small)]
        ends = [t - b for t, b in zip(totals, begins)]
        return Window(sizes, kernel, strides, dilations, begins, ends, outs)
    pads = [0] * (2 * dims) if auto_pad == "VALID" else list(n.attr("pads", [0] * (2 * dims)))
    begins, ends = pads[:dims], pads[dims:]
    outs = []
    for size, b, e, span, s in zip(sizes, begins, ends, spans, strides):
        room = size + b + e - span
        out = (-(-room // s) if ceil else room // s) + 1
        if ceil and (out - 1) * s >= size + b:  # the last window must start inside the input or its start pad
            out -= 1
        outs.append(out)
    return Window(sizes, kernel, strides, dilations, begins, ends, outs)


def _static(n: NodeGrad, name: str) -> list:
    shape = n.e.static_shape(name)
    if shape is None:
        raise n.refuse(f"the shape of {name!r} must be known")
    return shape


def _channel_sum(e: Emitter, grad: str, rank: int, like: str) -> str:
    """``grad`` summed over every axis but the channels (axis 1): a bias's gradient."""
    out = e.reduce_sum(grad, [0] + list(range(2, rank)), keepdims=False)
    e.info[out] = e.info[like]
    return out


def _weight_grad(e: Emitter, inp: str, grad: str, w: Window, group: int, channels: int, like: str) -> str:
    """``out[m, c, k] = sum over n, o of grad[n, m, o] * inp_padded[n, g(m) * C/G + c, o * stride + k * dilation]``,
    a convolution of ``inp`` (``channels`` C in G groups) by ``grad`` with the batch as channels, strides and
    dilations swapped; cut to the kernel's size."""
    dims = len(w.kernel)
    spatial = list(range(dims))
    if group == 1:
        inp_t = e.op("Transpose", [inp], perm=[1, 0] + [a + 2 for a in spatial])
    else:  # (N, C) -> (C/G, G * N): the channels of group g read the batch of that group
        split = e.op("Reshape", [inp, e.ints([0, group, channels // group] + w.sizes)])
        moved = e.op("Transpose", [split], perm=[2, 1, 0] + [a + 3 for a in spatial])
        inp_t = e.op("Reshape", [moved, e.ints([channels // group, -1] + w.sizes)])
    grad_t = e.op("Transpose", [grad], perm=[1, 0] + [a + 2 for a in spatial])
    full = e.op("Conv", [inp_t, grad_t], strides=w.dilations, dilations=w.strides, group=group,
                pads=w.begins + w.ends)
    cut = full
    if any(w.leftovers()):  # positions past the last window make the result longer than the kernel
        cut = e.op("Slice", [full, e.ints([0] * dims), e.ints(w.kernel), e.ints([a + 2 for a in spatial])])
    out = e.op("Transpose", [cut], perm=[1, 0] + [a + 2 for a in spatial])
    e.info[out] = e.info[like]
    return out


@rule("Conv")
def _conv(n: NodeGrad):
    x, weight = n.x[:2]
    e, dy, group = n.e, n.dy, int(n.attr("group", 1))
    kernel_shape = _static(n, weight)
    w = _window(n, x, kernel_shape[2:])
    grads = [None] * len(n.x)
    if n.needs[0]:
        grads[0] = e.op("ConvTranspose", [dy, weight], like=x, strides=w.strides, dilations=w.dilations,
                        group=group, pads=w.begins + w.ends, output_padding=w.leftovers())
    if n.needs[1]:
        grads[1] = _weight_grad(e, x, dy, w, group, kernel_shape[1] * group, weight)
    if len(n.x) > 2 and n.x[2] and n.needs[2]:
        grads[2] = _channel_sum(e, dy, len(w.sizes) + 2, n.x[2])
    return grads


@rule("ConvTranspose")
def _conv_transpose(n: NodeGrad):
    """``y[n, g * Co/G + co, i * stride + k * dilation - pad] += x[n, ci, i] * W[ci, co, k]``: the gradient of
    ``x`` is the convolution of ``dy`` by ``W``, the gradient of ``W`` the same sum as a Conv's with ``x`` and
    ``dy`` exchanged."""
    x, weight = n.x[:2]
    e, dy, group = n.e, n.dy, int(n.attr("group", 1))
    auto_pad = n.attr("auto_pad", b"NOTSET")
    if n.attr("output_shape") is not None or (auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad) not in (
            "NOTSET", "VALID"):
        raise n.refuse("only explicit pads are supported (no output_shape, auto_pad SAME_*)")
    kernel_shape = _static(n, weight)
    w = _window(n, x, kernel_shape[2:])
    y_shape = e.info[n.y].shape if n.y in e.info else None
    if y_shape is None or not all(isinstance(d, int) for d in y_shape[2:]):
        raise n.refuse(f"the spatial sizes of {n.y!r} must be known")
    # the same geometry seen from the output: windows over dy give back x's positions
    over_y = Window(list(y_shape[2:]), w.kernel, w.strides, w.dilations, w.begins, w.ends, w.sizes)
    grads = [None] * len(n.x)
    if n.needs[0]:
        grads[0] = e.op("Conv", [dy, weight], like=x, strides=w.strides, dilations=w.dilations, group=group,
                        pads=w.begins + w.ends)
    if n.needs[1]:
        grads[1] = _weight_grad(e, dy, x, over_y, group, kernel_shape[1] * group, weight)
    if len(n.x) > 2 and n.x[2] and n.needs[2]:
        grads[2] = _channel_sum(e, dy, len(w.sizes) + 2, n.x[2])
    return grads


# --- pooling ----------------------------------------------------------------------------------------------------
def _route_to_argmax(n: NodeGrad, x: str, dy: str, indices: str) -> str:
    """``dy`` added at the flat positions of ``x`` that ``indices`` (MaxPool's second output) names: each window's
    gradient goes to its maximum (the first one on ties, as MaxPool picks it), overlapping windows add up."""
    e = n.e
    if e.opset < 16:
        raise n.refuse("the gradient of a max pool needs opset 16 or more (ScatterElements with reduction)")
    size = e.op("Size", [x])
    zero = onnx.numpy_helper.from_array(np.zeros((1,), dtype=onnx.helper.tensor_dtype_to_np_dtype(e.dtype(x))))
    zeros = e.op("ConstantOfShape", [e.unsqueeze(size, [0])], value=zero)
    flat = e.op("ScatterElements", [zeros, e.op("Reshape", [indices, e.ints([-1])]),
                                    e.op("Reshape", [dy, e.ints([-1])])], axis=0, reduction="add")
    return e.op("Reshape", [flat, e.shape(x)], like=x)


def _pool_attrs(n: NodeGrad, w: Window) -> dict:
    return {"kernel_shape": w.kernel, "strides": w.strides, "dilations": w.dilations, "pads": w.begins + w.ends,
            "ceil_mode": int(n.attr("ceil_mode", 0))}


@rule("MaxPool")
def _max_pool(n: NodeGrad):
    if n.attr("storage_order", 0):
        raise n.refuse("storage_order=1 (column-major indices) is not supported")
    if len(n.dys) > 1 and n.dys[1] is not None:
        raise n.refuse("its indices output carries no gradient")
    x, e = n.x[0], n.e
    indices = n.node.output[1] if len(n.node.output) > 1 and n.node.output[1] else None
    if indices is None:  # the same pool again, for its indices
        w = _window(n, x)
        pooled = e.fresh(f"{e.prefix}_maxpool")
        indices = e.fresh(f"{e.prefix}_argmax")
        e.nodes.append(onnx.helper.make_node("MaxPool", [x], [pooled, indices], name=e.fresh(f"{indices}_node"),
                                             **_pool_attrs(n, w)))
    return [_route_to_argmax(n, x, n.dy, indices)]


@rule("GlobalMaxPool")
def _global_max_pool(n: NodeGrad):
    x, e = n.x[0], n.e
    sizes = _window(n, x, [1]).sizes
    pooled, indices = e.fresh(f"{e.prefix}_maxpool"), e.fresh(f"{e.prefix}_argmax")
    e.nodes.append(onnx.helper.make_node("MaxPool", [x], [pooled, indices], name=e.fresh(f"{indices}_node"),
                                         kernel_shape=sizes))
    return [_route_to_argmax(n, x, n.dy, indices)]


def _inside(w: Window) -> np.ndarray:
    """How many of each window's positions lie inside the input (not in the padding)."""
    per_axis = []
    for size, k, s, d, b, out in zip(w.sizes, w.kernel, w.strides, w.dilations, w.begins, w.outs):
        taps = (np.arange(out) * s - b)[:, None] + d * np.arange(k)[None, :]
        per_axis.append(((taps >= 0) & (taps < size)).sum(axis=1))
    counts = per_axis[0]
    for more in per_axis[1:]:
        counts = np.multiply.outer(counts, more)
    return counts


@rule("AveragePool")
def _average_pool(n: NodeGrad):
    """Linear: each window's gradient times the weight its positions have (one over its divisor), spread over the
    window (a ConvTranspose by ones over each channel alone), then cut to the input's extent.

    The weights are read from the runtime, as the same pool of an image of ones divided by the positions inside
    each window: with ``count_include_pad`` and ``ceil_mode``, onnxruntime 1.19 divides a window running past the
    padding by the whole kernel, 1.32 by the part inside the padding."""
    x, e = n.x[0], n.e
    w = _window(n, x)
    dims = len(w.sizes)
    attrs = {att.name: onnx.helper.get_attribute_value(att) for att in n.node.attribute}
    pooled_ones = e.op("AveragePool", [e.const(np.ones([1, 1] + w.sizes), like=x)], **attrs)
    weights = e.op("Div", [pooled_ones, e.const(np.maximum(_inside(w), 1), like=x)])
    scaled = n.op("Mul", [n.dy, weights])
    alone = e.op("Reshape", [scaled, e.ints([-1, 1] + w.outs)])  # (N * C, 1, out...)
    ones = e.const(np.ones([1, 1] + w.kernel), like=x)
    spread = e.op("ConvTranspose", [alone, ones], strides=w.strides, dilations=w.dilations)
    full = [(o - 1) * s + span for o, s, span in zip(w.outs, w.strides, w.spans)]  # covers -begin .. full - begin
    short = [max(0, b + size - f) for b, size, f in zip(w.begins, w.sizes, full)]
    if any(short):  # the windows stop before the input's end (positions no window reads get no gradient)
        spread = e.op("Pad", [spread, e.ints([0] * (dims + 2) + [0, 0] + short)])
    cut = e.op("Slice", [spread, e.ints(w.begins), e.ints([b + size for b, size in zip(w.begins, w.sizes)]),
                         e.ints(list(range(2, dims + 2)))])
    return [e.op("Reshape", [cut, e.shape(x)], like=x)]


@rule("GlobalAveragePool")
def _global_average_pool(n: NodeGrad):
    x, e = n.x[0], n.e
    sizes = _window(n, x, [1]).sizes
    scaled = n.op("Div", [n.dy, e.const(float(np.prod(sizes)), like=x)])
    return [e.op("Expand", [scaled, e.shape(x)], like=x)]


# --- normalizations ---------------------------------------------------------------------------------------------
def _mean(e: Emitter, x: str, axes: list, count: int | None, like: str) -> str:
    """The mean of ``x`` over ``axes`` (``count`` values each, counted at run time when None), kept as axes of
    size 1; ``like`` gives the element type."""
    total = e.reduce_sum(x, axes, keepdims=True)
    if count is None:
        divisor = e.op("Cast", [e.op("Div", [e.op("Size", [x]), e.op("Size", [total])])], to=e.dtype(like))
    else:
        divisor = e.const(float(count), like=like)
    return e.op("Div", [total, divisor])


def _normalized_grad(e: Emitter, dxhat: str, xhat: str, inv: str, axes: list, count: int | None, like: str) -> str:
    """The gradient of ``x`` when ``xhat = (x - mean(x)) * inv`` with ``inv = 1 / sqrt(var(x) + eps)`` taken over
    ``axes``: ``inv * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))``."""
    centered = e.op("Sub", [dxhat, _mean(e, dxhat, axes, count, like)])
    along = e.op("Mul", [xhat, _mean(e, e.op("Mul", [dxhat, xhat]), axes, count, like)])
    return e.op("Mul", [inv, e.op("Sub", [centered, along])], like=like)


def _count(e: Emitter, x: str, axes: list) -> int | None:
    """How many values of ``x`` the ``axes`` hold, None when a size is not known before run time."""
    shape = e.info[x].shape if x in e.info else None
    dims = None if shape is None else [shape[a] for a in axes]
    if dims is None or not all(isinstance(d, int) for d in dims):
        return None
    return int(np.prod(dims))


@rule("BatchNormalization")
def _batch_normalization(n: NodeGrad):
    """Per channel (axis 1) ``y = scale * (x - mean) / sqrt(var + eps) + B``: with frozen statistics (inference,
    the running mean and variance are inputs, which get their gradients too), or the batch's own (training_mode=1)."""
    if any(dy is not None for dy in n.dys[1:]):
        raise n.refuse("its running statistics outputs carry no gradient")
    x, scale, bias, mean, var = n.x[:5]
    e, dy = n.e, n.dy
    rank = n.rank(x)
    others = [0] + list(range(2, rank))
    column = e.ints([1, -1] + [1] * (rank - 2))
    as_column = lambda v: e.op("Reshape", [v, column])  # noqa: E731 (C,) -> (1, C, 1...)
    eps = e.const(float(n.attr("epsilon", 1e-5)), like=x)
    training = bool(n.attr("training_mode", 0)) and e.opset >= 14
    count = _count(e, x, others)
    scale_c = as_column(scale)
    if training:
        centered = e.op("Sub", [x, _mean(e, x, others, count, x)])
        batch_var = _mean(e, e.op("Mul", [centered, centered]), others, count, x)
        inv = e.op("Reciprocal", [e.op("Sqrt", [e.op("Add", [batch_var, eps])])])
    else:
        centered = e.op("Sub", [x, as_column(mean)])
        inv = as_column(e.op("Reciprocal", [e.op("Sqrt", [e.op("Add", [var, eps])])]))
    xhat = e.op("Mul", [centered, inv])
    grads = [None] * len(n.x)
    if n.needs[0]:
        dxhat = e.op("Mul", [dy, scale_c])
        grads[0] = (_normalized_grad(e, dxhat, xhat, inv, others, count, x) if training
                    else e.op("Mul", [dxhat, inv], like=x))
    if n.needs[1]:
        grads[1] = _channel_sum(e, e.op("Mul", [dy, xhat]), rank, scale)
    if n.needs[2]:
        grads[2] = _channel_sum(e, dy, rank, bias)
    if not training and (n.needs[3] or n.needs[4]):
        scaled = _channel_sum(e, e.op("Mul", [dy, scale_c]), rank, mean)  # sum of dy * scale per channel
        flat_inv = e.op("Reciprocal", [e.op("Sqrt", [e.op("Add", [var, eps])])])
        if n.needs[3]:
            grads[3] = e.op("Neg", [e.op("Mul", [scaled, flat_inv])], like=mean)
        if n.needs[4]:  # d/dvar of (var + eps)^-1/2 is -1/2 (var + eps)^-3/2
            weighted = _channel_sum(e, e.op("Mul", [e.op("Mul", [dy, scale_c]), xhat]), rank, var)
            half = e.const(-0.5, like=var)
            grads[4] = e.op("Mul", [half, e.op("Mul", [weighted, e.op("Mul", [flat_inv, flat_inv])])], like=var)
    return grads


@rule("LayerNormalization")
def _layer_normalization(n: NodeGrad):
    """``y = (x - mean) / sqrt(var + eps) * Scale + B`` over the axes from ``axis`` on; mean and variance are
    computed again here (the node's optional Mean and InvStdDev outputs carry no gradient)."""
    if any(dy is not None for dy in n.dys[1:]):
        raise n.refuse("its Mean and InvStdDev outputs carry no gradient")
    x, e, dy = n.x[0], n.e, n.dy
    rank = n.rank(x)
    axis = int(n.attr("axis", -1)) % rank
    axes = list(range(axis, rank))
    count = _count(e, x, axes)
    centered = e.op("Sub", [x, _mean(e, x, axes, count, x)])
    var = _mean(e, e.op("Mul", [centered, centered]), axes, count, x)
    eps = e.const(float(n.attr("epsilon", 1e-5)), like=x)
    inv = e.op("Reciprocal", [e.op("Sqrt", [e.op("Add", [var, eps])])])
    xhat = e.op("Mul", [centered, inv])
    grads = [None] * len(n.x)
    if n.needs[0]:
        grads[0] = _normalized_grad(e, e.op("Mul", [dy, n.x[1]]), xhat, inv, axes, count, x)
    if n.needs[1]:
        grads[1] = e.unbroadcast(e.op("Mul", [dy, xhat], like=n.y), n.x[1], n.y, [n.y])
    if len(n.x) > 2 and n.x[2] and n.needs[2]:
        grads[2] = e.unbroadcast(dy, n.x[2], n.y, [n.y])
    return grads


@rule("Dropout")
def _dropout(n: NodeGrad):
    """The identity in inference (no ``training_mode`` input, or before opset 12); in training the kept values'
    gradient scaled by ``1 / (1 - ratio)`` through the node's mask output."""
    e = n.e
    training = n.x[2] if len(n.x) > 2 and n.x[2] and e.opset >= 12 else None
    rest = [None] * (len(n.x) - 1)
    if training is None:
        return [n.dy] + rest
    mask = n.node.output[1] if len(n.node.output) > 1 and n.node.output[1] else None
    if mask is None:
        raise n.refuse("in training mode its gradient needs the node's mask output")
    ratio = n.x[1] if len(n.x) > 1 and n.x[1] else e.const(0.5, like=n.y)
    if e.dtype(ratio) != e.dtype(n.y):
        ratio = e.op("Cast", [ratio], to=e.dtype(n.y))
    one = e.const(1.0, like=n.y)
    scale = e.op("Where", [training, e.op("Reciprocal", [e.op("Sub", [one, ratio])]), one])
    kept = n.op("Cast", [mask], to=e.dtype(n.y))
    return [n.op("Mul", [n.op("Mul", [n.dy, kept]), scale])] + rest
