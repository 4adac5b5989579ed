"""One vector-Jacobian product per ONNX op, written as standard ONNX nodes.

A rule receives a :class:`NodeGrad` (the forward node, the gradients of its outputs, which inputs need a gradient,
and the :class:`~ortflow.graph.builder.Emitter` that writes nodes) and returns one gradient name per input of the
node (None where the input needs none). Elementwise rules return gradients shaped like the output and let
:meth:`NodeGrad.per_input` sum them back to each operand's shape (broadcasting).

Adding an op: write ``@rule("OpType")`` above a function of a :class:`NodeGrad`; ops whose float outputs are
piecewise constant (no gradient, not an error) go in :data:`NO_GRADIENT`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from ..exceptions import NotDifferentiableError
from ..graph.builder import Emitter, ValueInfo

#: Ops whose outputs carry no gradient: non-float results, or float results that are piecewise constant.
NO_GRADIENT = frozenset({
    "ArgMax", "ArgMin", "And", "Ceil", "Constant", "ConstantOfShape", "Equal", "EyeLike", "Floor", "Greater",
    "GreaterOrEqual", "IsInf", "IsNaN", "Less", "LessOrEqual", "NonZero", "Not", "Or", "RandomNormal",
    "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Range", "Round", "Shape", "Sign", "Size", "Xor",
})

Rule = Callable[["NodeGrad"], Sequence["str | None"]]
RULES: dict[str, Rule] = {}


def node_label(node: onnx.NodeProto, index: int) -> str:
    """The node's name, or ``'#<index> <op>'`` for an unnamed node (its position in the graph)."""
    return node.name or f"#{index} {node.op_type}"


@dataclass
class NodeGrad:
    """What a rule needs: the forward ``node`` (at ``index`` in the graph), ``dys`` (the gradient of each output,
    None where none reaches it), ``needs`` (per input, whether its gradient is wanted) and the emitter ``e``."""

    node: onnx.NodeProto
    index: int
    dys: list
    needs: list
    e: Emitter

    @property
    def x(self) -> list[str]:
        return list(self.node.input)

    @property
    def y(self) -> str:
        return self.node.output[0]

    @property
    def dy(self) -> str:
        return self.dys[0]

    def attr(self, name: str, default=None):
        for att in self.node.attribute:
            if att.name == name:
                return helper.get_attribute_value(att)
        return default

    def rank(self, name: str) -> int:
        rank = _rank(self.e, name)
        if rank is None:
            raise self.refuse(f"the rank of {name!r} is unknown")
        return rank

    def refuse(self, reason: str) -> NotDifferentiableError:
        return NotDifferentiableError(
            f"node {node_label(self.node, self.index)!r} (op {self.node.op_type}): {reason}")

    def per_input(self, make: Callable[[int], str]) -> list:
        """``make(i)`` (a gradient shaped like the output) for every input that needs one, summed back to the
        input's shape."""
        return [self.e.unbroadcast(make(i), x, self.y, self.x) if need else None
                for i, (x, need) in enumerate(zip(self.x, self.needs))]

    def op(self, op_type: str, inputs: Sequence[str], **attrs) -> str:
        """A node whose output is shaped and typed like the forward output."""
        return self.e.op(op_type, inputs, like=self.y, **attrs)

    def one(self) -> str:
        return self.e.const(1.0, like=self.y)


def rule(*ops: str) -> Callable[[Rule], Rule]:
    def register(function: Rule) -> Rule:
        for op in ops:
            RULES[op] = function
        return function
    return register


# --- elementwise ------------------------------------------------------------------------------------------------
@rule("Identity")
def _identity(n: NodeGrad):
    return [n.dy]


@rule("Add", "Sum")
def _add(n: NodeGrad):
    return n.per_input(lambda i: n.dy)


@rule("Sub")
def _sub(n: NodeGrad):
    return n.per_input(lambda i: n.dy if i == 0 else n.op("Neg", [n.dy]))


@rule("Mul")
def _mul(n: NodeGrad):
    a, b = n.x
    if a == b:  # x * x: one gradient 2 x dy instead of two added together
        return [n.op("Mul", [n.dy, n.op("Add", [a, a])]), None]
    return n.per_input(lambda i: n.op("Mul", [n.dy, n.x[1 - i]]))


@rule("Div")
def _div(n: NodeGrad):
    a, b = n.x
    return n.per_input(lambda i: n.op("Div", [n.dy, b]) if i == 0
                       else n.op("Neg", [n.op("Mul", [n.dy, n.op("Div", [n.y, b])])]))


@rule("Neg")
def _neg(n: NodeGrad):
    return [n.op("Neg", [n.dy])]


@rule("Relu")
def _relu(n: NodeGrad):
    # the mask from the output (relu(x) > 0 exactly where x > 0), so the forward pass may fuse Gemm + Relu; on
    # onnxruntime's CPU, Cast(Greater) is vectorized where Sign (2x slower) and Where (8x) are scalar loops
    positive = n.e.op("Greater", [n.y, n.e.const(0.0, like=n.y)])
    return [n.op("Mul", [n.dy, n.e.op("Cast", [positive], like=n.y, to=n.e.dtype(n.y))])]


@rule("LeakyRelu")
def _leaky_relu(n: NodeGrad):
    alpha = n.e.const(n.attr("alpha", 0.01), like=n.y)
    positive = n.e.op("Greater", [n.x[0], n.e.const(0.0, like=n.x[0])])
    return [n.op("Where", [positive, n.dy, n.op("Mul", [n.dy, alpha])])]


@rule("Tanh")
def _tanh(n: NodeGrad):
    return [n.op("Mul", [n.dy, n.op("Sub", [n.one(), n.op("Mul", [n.y, n.y])])])]


@rule("Sigmoid")
def _sigmoid(n: NodeGrad):
    return [n.op("Mul", [n.dy, n.op("Mul", [n.y, n.op("Sub", [n.one(), n.y])])])]


@rule("Softplus")
def _softplus(n: NodeGrad):
    return [n.op("Mul", [n.dy, n.op("Sigmoid", [n.x[0]])])]


@rule("Exp")
def _exp(n: NodeGrad):
    return [n.op("Mul", [n.dy, n.y])]


@rule("Log")
def _log(n: NodeGrad):
    return [n.op("Div", [n.dy, n.x[0]])]


@rule("Abs")
def _abs(n: NodeGrad):
    return [n.op("Mul", [n.dy, n.op("Sign", [n.x[0]])])]


@rule("Sqrt")
def _sqrt(n: NodeGrad):
    return [n.op("Div", [n.op("Mul", [n.dy, n.e.const(0.5, like=n.y)]), n.y])]


@rule("Reciprocal")
def _reciprocal(n: NodeGrad):
    return [n.op("Neg", [n.op("Mul", [n.dy, n.op("Mul", [n.y, n.y])])])]


@rule("Pow")
def _pow(n: NodeGrad):
    if n.needs[1]:
        raise n.refuse("only a constant exponent is supported (the exponent depends on a differentiated value)")
    x, exponent = n.x
    if n.e.dtype(exponent) != n.e.dtype(x):
        exponent = n.e.op("Cast", [exponent], to=n.e.dtype(x))
    slope = n.op("Mul", [exponent, n.op("Pow", [x, n.op("Sub", [exponent, n.one()])])])
    return n.per_input(lambda i: n.op("Mul", [n.dy, slope]))


@rule("Erf")
def _erf(n: NodeGrad):
    x = n.x[0]
    slope = n.op("Exp", [n.op("Neg", [n.op("Mul", [x, x])])])
    return [n.op("Mul", [n.dy, n.op("Mul", [slope, n.e.const(2 / np.sqrt(np.pi), like=x)])])]


@rule("Gelu")
def _gelu(n: NodeGrad):
    """``x * Phi(x)`` (Phi the normal distribution function), or its tanh approximation; opset 20."""
    x, e = n.x[0], n.e
    half = e.const(0.5, like=x)
    c = lambda value: e.const(value, like=x)  # noqa: E731
    approximate = n.attr("approximate", b"none")
    if (approximate.decode() if isinstance(approximate, bytes) else approximate) == "tanh":
        # y = x / 2 (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3)
        square = n.op("Mul", [x, x])
        t = n.op("Tanh", [n.op("Mul", [c(np.sqrt(2 / np.pi)), n.op("Mul", [x, n.op("Add", [n.one(), n.op(
            "Mul", [c(0.044715), square])])])])])
        du = n.op("Mul", [c(np.sqrt(2 / np.pi)), n.op("Add", [n.one(), n.op("Mul", [c(3 * 0.044715), square])])])
        inner = n.op("Mul", [n.op("Mul", [x, n.op("Sub", [n.one(), n.op("Mul", [t, t])])]), du])
        slope = n.op("Mul", [half, n.op("Add", [n.op("Add", [n.one(), t]), inner])])
    else:  # Phi(x) + x phi(x)
        phi_cdf = n.op("Mul", [half, n.op("Add", [n.one(), n.op("Erf", [n.op("Mul", [x, c(np.sqrt(0.5))])])])])
        density = n.op("Mul", [c(1 / np.sqrt(2 * np.pi)), n.op("Exp", [n.op("Mul", [c(-0.5), n.op("Mul", [x, x])])])])
        slope = n.op("Add", [phi_cdf, n.op("Mul", [x, density])])
    return [n.op("Mul", [n.dy, slope])]


@rule("Max", "Min")
def _max_min(n: NodeGrad):
    """The gradient goes to the inputs equal to the result, shared evenly on ties (as torch.maximum does)."""
    e = n.e
    hits = [n.op("Cast", [e.op("Equal", [x, n.y])], to=e.dtype(n.y)) for x in n.x]
    share = n.op("Div", [n.dy, hits[0] if len(hits) == 1 else n.op("Sum", hits)])
    return n.per_input(lambda i: n.op("Mul", [share, hits[i]]))


@rule("Where")
def _where(n: NodeGrad):
    zero = n.e.const(0.0, like=n.y)
    return n.per_input(lambda i: n.op("Where", [n.x[0], n.dy, zero] if i == 1 else [n.x[0], zero, n.dy]))


@rule("Clip")
def _clip(n: NodeGrad):
    if any(n.needs[1:]):
        raise n.refuse("only constant bounds are supported (a bound depends on a differentiated value)")
    x, zero, grad = n.x[0], n.e.const(0.0, like=n.y), n.dy
    if n.e.opset < 11:
        low, high = n.attr("min"), n.attr("max")
        low = None if low is None else n.e.const(low, like=x)
        high = None if high is None else n.e.const(high, like=x)
    else:
        low, high = [(n.x[i] if len(n.x) > i and n.x[i] else None) for i in (1, 2)]
    if low is not None:
        grad = n.op("Where", [n.e.op("Less", [x, low]), zero, grad])
    if high is not None:
        grad = n.op("Where", [n.e.op("Greater", [x, high]), zero, grad])
    return [grad]


@rule("Cast")
def _cast(n: NodeGrad):
    return [n.e.op("Cast", [n.dy], like=n.x[0], to=n.e.dtype(n.x[0]))]


@rule("Expand")
def _expand(n: NodeGrad):
    return [n.e.unbroadcast(n.dy, n.x[0], n.y, [n.x[0], n.y]), None]


# --- normalizations ---------------------------------------------------------------------------------------------
def _softmax_axes(n: NodeGrad) -> list[int]:
    """Softmax normalizes along ``axis`` from opset 13, over every axis from ``axis`` on before."""
    if n.e.opset >= 13:
        return [n.attr("axis", -1)]
    rank = n.rank(n.x[0])
    axis = n.attr("axis", 1)
    return list(range(axis % rank, rank))


@rule("Softmax")
def _softmax(n: NodeGrad):
    inner = n.e.reduce_sum(n.op("Mul", [n.dy, n.y]), _softmax_axes(n), keepdims=True)
    return [n.op("Mul", [n.y, n.op("Sub", [n.dy, inner])])]


@rule("LogSoftmax")
def _log_softmax(n: NodeGrad):
    total = n.e.reduce_sum(n.dy, _softmax_axes(n), keepdims=True)
    return [n.op("Sub", [n.dy, n.op("Mul", [n.op("Exp", [n.y]), total])])]


# --- linear algebra ---------------------------------------------------------------------------------------------
def _swap_last(e: Emitter, x: str, rank: int) -> str:
    perm = list(range(rank))
    perm[-2:] = perm[-1], perm[-2]
    return e.op("Transpose", [x], perm=perm)


@rule("MatMul")
def _matmul(n: NodeGrad):
    a, b = n.x
    rb = n.rank(b)
    if rb == 2 and _rank(n.e, a) != 2:
        return _matmul_by_matrix(n)
    ra = n.rank(a)
    e, dy = n.e, n.dy
    need_a, need_b = n.needs
    da = db = None
    if ra == 1 and rb == 1:  # dot product: y is a scalar
        da = need_a and e.op("Mul", [dy, b], like=a)
        db = need_b and e.op("Mul", [dy, a], like=b)
    elif rb == 1:  # (..., K) @ (K,) -> (...)
        da = need_a and e.op("Mul", [e.unsqueeze(dy, [-1]), b], like=a)
        db = need_b and e.op("MatMul", [e.op("Reshape", [dy, e.ints([-1])]), e.op("Flatten", [a], axis=ra - 1)],
                             like=b)
    elif ra == 1:  # (K,) @ (..., K, N) -> (..., N), rank of b > 2
        if need_a:
            column = e.op("MatMul", [b, e.unsqueeze(dy, [-1])])
            da = e.op("Reshape", [e.reduce_sum(column, list(range(rb - 2)), keepdims=False), e.shape(a)], like=a)
        db = need_b and e.op("Mul", [e.unsqueeze(a, [-1]), e.unsqueeze(dy, [-2])], like=b)
    elif ra == rb == 2:  # Gemm transposes inside its kernel
        da = need_a and e.op("Gemm", [dy, b], like=a, transB=1)
        db = need_b and e.op("Gemm", [a, dy], like=b, transA=1)
    else:  # batched on both sides (rank of b > 2)
        if need_a:
            da = e.unbroadcast_batch(e.op("MatMul", [dy, _swap_last(e, b, rb)]), a, n.y)
        if need_b:
            db = e.unbroadcast_batch(e.op("MatMul", [_swap_last(e, a, ra), dy]), b, n.y)
    return [da or None, db or None]


def _matmul_by_matrix(n: NodeGrad) -> list:
    """``a @ b`` with ``b`` of shape (K, N) and ``a`` of any rank but 2 (even unknown): ``b``'s gradient is one
    product over all the rows of ``a`` flattened to (-1, K)."""
    (a, b), e, dy = n.x, n.e, n.dy
    da = db = None
    if n.needs[0]:
        da = e.op("MatMul", [dy, e.op("Transpose", [b], perm=[1, 0])], like=a)
    if n.needs[1]:
        rows, cols = (_last_dim_as(e, b, axis) for axis in (0, 1))
        flat_a, flat_dy = e.op("Reshape", [a, rows]), e.op("Reshape", [dy, cols])
        db = e.op("Gemm", [flat_a, flat_dy], like=b, transA=1)
    return [da, db]


def _last_dim_as(e: Emitter, matrix: str, axis: int) -> str:
    """The shape ``(-1, matrix.shape[axis])``, a constant when that dimension is known."""
    dim = e.info[matrix].shape[axis]
    if isinstance(dim, int):
        return e.ints([-1, dim])
    return e.op("Concat", [e.ints([-1]), e.op("Slice", [e.shape(matrix), e.ints([axis]), e.ints([axis + 1])])],
                axis=0)


def _rank(e: Emitter, name: str) -> int | None:
    shape = e.info[name].shape if name in e.info else None
    return None if shape is None else len(shape)


@rule("Gemm")
def _gemm(n: NodeGrad):
    a, b = n.x[:2]
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    trans_a, trans_b = int(n.attr("transA", 0)), int(n.attr("transB", 0))
    e, dy = n.e, n.dy
    grads = [None] * len(n.x)
    if n.needs[0]:
        if trans_a:
            grads[0] = e.op("Gemm", [b, dy], like=a, alpha=alpha, transA=trans_b, transB=1)
        else:
            grads[0] = e.op("Gemm", [dy, b], like=a, alpha=alpha, transB=1 - trans_b)
    if n.needs[1]:
        if trans_b:
            grads[1] = e.op("Gemm", [dy, a], like=b, alpha=alpha, transA=1, transB=trans_a)
        else:
            grads[1] = e.op("Gemm", [a, dy], like=b, alpha=alpha, transA=1 - trans_a)
    if len(n.x) > 2 and n.x[2] and n.needs[2]:
        scaled = dy if beta == 1.0 else n.op("Mul", [dy, e.const(beta, like=n.y)])
        grads[2] = e.unbroadcast(scaled, n.x[2], n.y, [n.y])
    return grads


@rule("Einsum")
def _einsum(n: NodeGrad):
    """The gradient of operand k is the Einsum of the output's gradient with the other operands, written back to
    k's subscripts; letters of k summed away alone (in no other term) are expanded back."""
    equation = n.attr("equation")
    equation = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
    terms, _, out = equation.partition("->")
    terms = terms.split(",")
    if "." in equation or any(len(set(t)) != len(t) for t in terms):
        raise n.refuse(f"equation {equation!r}: ellipsis and repeated subscripts (diagonals) are not supported")
    if "->" not in equation:  # implicit output: the letters seen once, in alphabetical order
        out = "".join(sorted(c for c in set("".join(terms)) if "".join(terms).count(c) == 1))
    e, grads = n.e, []
    for k, (x, need) in enumerate(zip(n.x, n.needs)):
        if not need:
            grads.append(None)
            continue
        others = [t for i, t in enumerate(terms) if i != k]
        seen = set(out).union(*others)
        kept = "".join(c for c in terms[k] if c in seen)
        grad = e.op("Einsum", [n.dy] + [v for i, v in enumerate(n.x) if i != k],
                    equation=",".join([out] + others) + "->" + kept)
        if kept != terms[k]:
            lost = [i for i, c in enumerate(terms[k]) if c not in seen]
            grad = e.op("Expand", [e.unsqueeze(grad, lost), e.shape(x)])
        e.info[grad] = e.info.get(x, ValueInfo())
        grads.append(grad)
    return grads


# --- reductions and shapes --------------------------------------------------------------------------------------
@rule("ReduceSum", "ReduceMean")
def _reduce(n: NodeGrad):
    x, e = n.x[0], n.e
    axes_as_input = e.opset >= (13 if n.node.op_type == "ReduceSum" else 18)
    axes = (n.x[1] if len(n.x) > 1 and n.x[1] else None) if axes_as_input else n.attr("axes")
    if axes is None and axes_as_input and n.attr("noop_with_empty_axes", 0):
        return [n.dy] + [None] * (len(n.x) - 1)
    grad = n.dy
    if n.node.op_type == "ReduceMean":  # divided while it is small
        sizes = [e.static_shape(x), e.static_shape(n.y)]
        if None not in sizes and int(np.prod(sizes[1], dtype=np.int64)):  # a shape-specialised graph: a constant
            count = e.const(int(np.prod(sizes[0], dtype=np.int64)) // int(np.prod(sizes[1], dtype=np.int64)), like=x)
        else:
            count = e.op("Cast", [e.op("Div", [e.op("Size", [x]), e.op("Size", [n.y])])], to=e.dtype(x))
        grad = e.op("Div", [grad, count])
    if axes is not None and not n.attr("keepdims", 1):
        grad = e.unsqueeze(grad, axes)
    if not _only_unit_axes(e, x, axes):
        grad = e.op("Expand", [grad, e.shape(x)])
    e.info[grad] = e.info.get(x, ValueInfo())
    return [grad] + [None] * (len(n.x) - 1)


def _only_unit_axes(e: Emitter, x: str, axes) -> bool:
    """True when every reduced axis of ``x`` has size 1: the reduction only dropped or kept unit axes."""
    shape = e.info[x].shape if x in e.info else None
    if isinstance(axes, str):
        axes = e.info[axes].value if axes in e.info else None
    if shape is None or axes is None:
        return False
    return all(shape[int(a)] == 1 for a in np.asarray(axes).reshape(-1))


@rule("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(n: NodeGrad):
    return [n.e.op("Reshape", [n.dy, n.e.shape(n.x[0])], like=n.x[0])] + [None] * (len(n.x) - 1)


@rule("Transpose")
def _transpose(n: NodeGrad):
    perm = n.attr("perm")
    if perm is None:
        return [n.e.op("Transpose", [n.dy], like=n.x[0])]
    return [n.e.op("Transpose", [n.dy], like=n.x[0], perm=[int(i) for i in np.argsort(perm)])]


@rule("Concat")
def _concat(n: NodeGrad):
    e, axis = n.e, int(n.attr("axis"))
    if e.opset < 10:
        raise n.refuse("the gradient of Concat needs opset 10 or more (Slice with inputs)")
    axis_in = e.ints([axis])
    start = e.ints([0])
    grads = []
    for x, need in zip(n.x, n.needs):
        end = e.op("Add", [start, e.op("Gather", [e.shape(x), axis_in])])
        grads.append(e.op("Slice", [n.dy, start, end, axis_in], like=x) if need else None)
        start = end
    return grads


@rule("Slice")
def _slice(n: NodeGrad):
    """Scatter the output gradient back at the positions the same Slice picks from an array of flat indices."""
    x, e = n.x[0], n.e
    if e.opset < 11:
        raise n.refuse("the gradient of Slice needs opset 11 or more (Range, ScatterElements)")
    size = e.op("Size", [x])
    positions = e.op("Reshape", [e.op("Range", [e.const(0, dtype=onnx.TensorProto.INT64), size,
                                                e.const(1, dtype=onnx.TensorProto.INT64)]), e.shape(x)])
    picked = e.op("Reshape", [e.op("Slice", [positions] + n.x[1:]), e.ints([-1])])
    zero = onnx.numpy_helper.from_array(np.zeros((1,), dtype=helper.tensor_dtype_to_np_dtype(e.dtype(x))))
    zeros = e.op("ConstantOfShape", [e.unsqueeze(size, [0])], value=zero)
    flat = e.op("ScatterElements", [zeros, picked, e.op("Reshape", [n.dy, e.ints([-1])])], axis=0)
    return [e.op("Reshape", [flat, e.shape(x)], like=x)] + [None] * (len(n.x) - 1)
