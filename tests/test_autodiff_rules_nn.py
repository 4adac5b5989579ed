"""ortflow's gradient rules of the neural-network ops (convolutions, pools, normalizations, dropout, Gather, Split,
Pad, Tile, Einsum, Max/Min, Erf, Gelu), each against float64 central finite differences.

onnxruntime has no float64 kernel for several of these ops (Conv, ConvTranspose, AveragePool, the global pools,
Erf, Gelu), so the float64 check runs the forward and the gradient graphs in onnx's reference evaluator; the same
graphs in float32 then run in onnxruntime and must match the float64 gradient at the same (rounded) values within
their float32 rounding (tests/tolerances.py).
"""

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_max_pool import MaxPool as ReferenceMaxPool

from ortflow import NotDifferentiableError, onnx_derivative
from ortflow._ort import InferenceSession, SessionOptions, ort
from ortflow.autodiff import nodes_without_rule
from test_autodiff_rules import _const, _weights_as_inputs, finite_differences
from tolerances import assert_close, float32_sum_atol

D, F = TensorProto.DOUBLE, TensorProto.FLOAT
RNG = np.random.default_rng(0)
STEP = 1e-6


def _model(nodes, inputs, weights, opset=17, outputs=("y",)):
    """A float64 graph: ``inputs`` name -> (declared shape) or (shape, element type), ``weights`` name -> array."""
    declared = [helper.make_tensor_value_info(n, *(s if isinstance(s, tuple) else (D, s))) for n, s in inputs.items()]
    graph = helper.make_graph(nodes, "case", declared, [helper.make_tensor_value_info(o, D, None) for o in outputs],
                              [numpy_helper.from_array(np.asarray(v, dtype=np.float64), n) for n, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _values(shape, low=0.2, high=1.5):
    """Values away from 0 and from each other's ties (max pools) so that finite differences are exact enough."""
    return RNG.uniform(low, high, size=shape) * RNG.choice([-1.0, 1.0], size=shape)


def _float32(model):
    """The same graph in float32: initializers, declared types, constants and casts."""
    new = onnx.ModelProto()
    new.CopyFrom(model)
    for init in new.graph.initializer:
        if init.data_type == D:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float32), init.name))
    for value in list(new.graph.input) + list(new.graph.output):
        if value.type.tensor_type.elem_type == D:
            value.type.tensor_type.elem_type = F
    for node in new.graph.node:
        for att in node.attribute:
            if att.name == "value" and att.t.data_type == D:
                att.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(att.t).astype(np.float32)))
            if att.name == "to" and att.i == D:
                att.i = F
    return new


class ConvTranspose(OpRun):
    """ConvTranspose written out as its definition (explicit pads only): onnx 1.17's reference mixes up the
    channels of grouped kernels."""

    def _run(self, x, w, b=None, auto_pad=None, dilations=None, group=None, kernel_shape=None, output_padding=None,
             output_shape=None, pads=None, strides=None):
        dims, group = x.ndim - 2, group or 1
        kernel = w.shape[2:]
        strides, dilations = strides or [1] * dims, dilations or [1] * dims
        pads, extra = pads or [0] * (2 * dims), output_padding or [0] * dims
        outs = [s * (i - 1) + e + (k - 1) * d + 1 - p0 - p1 for s, i, e, k, d, p0, p1 in
                zip(strides, x.shape[2:], extra, kernel, dilations, pads[:dims], pads[dims:])]
        per_in, per_out = x.shape[1] // group, w.shape[1]
        y = np.zeros((x.shape[0], per_out * group, *outs), dtype=x.dtype)
        for g in range(group):
            xs, ws = x[:, g * per_in:(g + 1) * per_in], w[g * per_in:(g + 1) * per_in]
            for i in np.ndindex(*x.shape[2:]):
                for k in np.ndindex(*kernel):
                    at = [ii * s + kk * d - p for ii, kk, s, d, p in zip(i, k, strides, dilations, pads)]
                    if all(0 <= a < o for a, o in zip(at, outs)):
                        y[(slice(None), slice(g * per_out, (g + 1) * per_out), *at)] += (
                            xs[(slice(None), slice(None), *i)] @ ws[(slice(None), slice(None), *k)])
        if b is not None:
            y += b.reshape(1, -1, *[1] * dims)
        return (y,)


class MaxPool(ReferenceMaxPool):
    """The reference's pooled values with indices computed from their definition (onnx 1.17's are wrong with pads
    and over a whole image): the flat position in ``x`` of each window's first maximum, as onnxruntime gives."""

    def _run(self, x, auto_pad=None, ceil_mode=None, dilations=None, kernel_shape=None, pads=None,
             storage_order=None, strides=None):
        y = super()._run(x, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations, kernel_shape=kernel_shape,
                         pads=pads, storage_order=storage_order, strides=strides)[0]
        dims, sizes = x.ndim - 2, x.shape[2:]
        strides, dilations = strides or [1] * dims, dilations or [1] * dims
        pads = pads or [0] * (2 * dims)
        base = np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[:2]) * int(np.prod(sizes))
        indices = np.zeros(y.shape, dtype=np.int64)
        for o in np.ndindex(*y.shape[2:]):
            taps = [t for t in ([oi * s - p + ki * d for oi, ki, s, d, p in zip(o, k, strides, dilations, pads)]
                                for k in np.ndindex(*kernel_shape)) if all(0 <= a < n for a, n in zip(t, sizes))]
            values = np.stack([x[(slice(None), slice(None), *t)] for t in taps], axis=-1)
            first = np.argmax(values, axis=-1)
            flat = np.array([np.ravel_multi_index(t, sizes) for t in taps])
            indices[(slice(None), slice(None), *o)] = base + flat[first]
        return (y, indices)


class GlobalMaxPool(OpRun):
    """The maximum over the spatial axes (onnx 1.17's reference mixes up the channels of 1-D inputs)."""

    def _run(self, x):
        return (x.max(axis=tuple(range(2, x.ndim)), keepdims=True),)


class Pad(OpRun):
    """Constant padding where negative pads crop, as the specification allows (onnx 1.17's reference refuses
    them)."""

    def _run(self, x, pads, value=None, axes=None, mode=None):
        axes = list(range(x.ndim)) if axes is None else [int(a) % x.ndim for a in axes]
        begins, ends = [0] * x.ndim, [0] * x.ndim
        for i, axis in enumerate(axes):
            begins[axis], ends[axis] = int(pads[i]), int(pads[i + len(axes)])
        x = x[tuple(slice(max(-b, 0), n - max(-e, 0)) for b, e, n in zip(begins, ends, x.shape))]
        widths = [(max(b, 0), max(e, 0)) for b, e in zip(begins, ends)]
        return (np.pad(x, widths, constant_values=0 if value is None else value),)


_erf = np.vectorize(math.erf, otypes=[np.float64])


class Erf(OpRun):
    """math.erf (onnx 1.23's reference approximates it within 1e-8, too coarse for finite differences)."""

    def _run(self, x):
        return (_erf(x).astype(x.dtype),)


class Gelu(OpRun):
    def _run(self, x, approximate="none"):
        if approximate == "tanh":
            return ((0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))).astype(x.dtype),)
        return ((0.5 * x * (1 + _erf(x / np.sqrt(2)))).astype(x.dtype),)


def _run_reference(model, feeds):
    names = [i.name for i in model.graph.input]
    evaluator = ReferenceEvaluator(model, new_ops=[ConvTranspose, MaxPool, GlobalMaxPool, Pad, Erf, Gelu])
    return evaluator.run(None, {k: v for k, v in feeds.items() if k in names})


def _session(model):
    options = SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def check_gradient(model, feeds, elementwise=False, onnxruntime=True):
    """Every float input's and weight's gradient of ``sum(y * G)`` for a random ``G``:

    1. float64, in the reference evaluator: equal to central finite differences (rtol 1e-6, atol 1e-7, the rule
       of tests/test_autodiff_rules.py);
    2. the same graph in onnxruntime: in float64 where it has the kernels, equal to step 1's gradient by the same
       rule; else in float32, equal to step 1's gradient at the float32 values within the rounding of a float32
       sum of as many terms as ``y`` has elements, whose absolute values add up to the float64 gradient at the
       absolute values of everything (exact for the multilinear ops that lack float64 kernels: convolutions and
       pools); an elementwise op's gradient (``elementwise``: Erf, Gelu) is one term, of its own magnitude.
    """
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.data_type == D}
    derivative = onnx_derivative(model, inputs=True, fill_grad=False)
    forward = _weights_as_inputs(model)
    values = {**feeds, **weights}
    y = _run_reference(forward, values)[0]
    upstream = RNG.normal(size=y.shape)
    names = [o.name for o in derivative.graph.output]
    got = dict(zip(names, _run_reference(derivative, {**values, "y_grad": upstream})))
    run = lambda v: _run_reference(forward, v)[0]  # noqa: E731
    for name, expected in finite_differences(run, values, upstream, STEP).items():
        value = values[name]
        assert got[f"{name}_grad"].shape == value.shape, name
        np.testing.assert_allclose(got[f"{name}_grad"], expected, rtol=1e-6, atol=1e-7, err_msg=name)
    if onnxruntime:
        try:
            sess = _session(derivative)
        except Exception as exc:  # noqa: BLE001 (onnxruntime's NotImplemented is not importable by name)
            if "NOT_IMPLEMENTED" not in str(exc):
                raise
            _check_float32(model, values, upstream, elementwise)
        else:
            ours = dict(zip(names, sess.run(None, {**values, "y_grad": upstream})))
            for name in names:
                np.testing.assert_allclose(ours[name], got[name], rtol=1e-6, atol=1e-7, err_msg=name)
    return derivative


def _check_float32(model, values, upstream, elementwise):
    rounded = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in values.items()}
    as64 = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in rounded.items()}
    upstream32 = upstream.astype(np.float32)
    derivative64 = onnx_derivative(model, inputs=True, fill_grad=False)
    names = [o.name for o in derivative64.graph.output]
    exact = dict(zip(names, _run_reference(derivative64, {**as64, "y_grad": upstream32.astype(np.float64)})))
    if elementwise:
        # each element's derivative is a few terms as large as the op's derivative on this range (Gelu's
        # Phi(x) + x phi(x) cancel near x = -0.75, to a result far smaller than its terms): the upstream times the
        # largest derivative seen, not the element's own result
        scale = {k: np.abs(v / upstream).max() if v.shape == upstream.shape else 0.0 for k, v in exact.items()}
        magnitude = {k: np.maximum(np.abs(v), scale[k] * np.abs(upstream)) if v.shape == upstream.shape
                     else np.abs(v) for k, v in exact.items()}
    else:
        absolute = {k: np.abs(v) if v.dtype == np.float64 else v for k, v in as64.items()}
        magnitude = dict(zip(names, _run_reference(derivative64, {**absolute, "y_grad": np.abs(upstream)})))
    sess = _session(onnx_derivative(_float32(model), inputs=True, fill_grad=False))
    feeds = {i.name: rounded[i.name] if i.name in rounded else upstream32 for i in sess.get_inputs()}
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    terms = 1 if elementwise else upstream.size
    for name in names:
        assert_close(got[name], exact[name], rtol=1e-5, atol=float32_sum_atol(magnitude[name], terms), err_msg=name)


def _ints(name, values):
    return _const(name, np.asarray(values, dtype=np.int64))


# --- convolutions -----------------------------------------------------------------------------------------------
CONVS = [
    ("plain", (2, 3, 6, 6), (4, 3, 3, 3), {}),
    ("stride_pads_dilation", (1, 2, 8, 7), (3, 2, 3, 2),
     {"strides": [2, 3], "pads": [1, 0, 2, 1], "dilations": [2, 1]}),
    ("groups", (2, 4, 5, 5), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    ("depthwise_stride", (1, 3, 7, 7), (3, 1, 3, 3), {"group": 3, "strides": [2, 2]}),
    ("1d", (2, 3, 9), (4, 3, 3), {"strides": [2], "pads": [1, 2]}),
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", CONVS, ids=[c[0] for c in CONVS])
def test_conv_rule(case, bias):
    _, xs, ws, attrs = case
    weights = {"w": _values(ws)} | ({"b": _values(ws[:1])} if bias else {})
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs)
    check_gradient(_model([node], {"x": ["N", *xs[1:]]}, weights), {"x": _values(xs)})


#: auto_pad and the explicit pads that onnxruntime applies for it (onnx 1.17's reference evaluator gets auto_pad
#: wrong, so these run in onnxruntime against the same Conv with explicit pads)
AUTO_PADS = [
    ("same_upper", (1, 2, 7, 6), (3, 2, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, [1, 0, 1, 1]),
    ("same_lower", (1, 2, 6, 5), (2, 2, 2, 2), {"auto_pad": "SAME_LOWER"}, [1, 1, 0, 0]),
    ("valid", (2, 2, 5, 5), (2, 2, 2, 3), {"auto_pad": "VALID", "strides": [2, 1]}, [0, 0, 0, 0]),
]


@pytest.mark.parametrize("case", AUTO_PADS, ids=[c[0] for c in AUTO_PADS])
def test_conv_rule_with_auto_pad(case):
    """The gradients of a Conv with auto_pad equal those of the Conv with its explicit pads (checked above), in
    onnxruntime (float32), where both forward passes agree."""
    _, xs, ws, attrs, pads = case
    explicit = {k: v for k, v in attrs.items() if k != "auto_pad"} | {"pads": pads}
    x, weights = _values(xs).astype(np.float32), {"w": _values(ws), "b": _values(ws[:1])}
    models = [_float32(_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **a)], {"x": ["N", *xs[1:]]},
                              weights)) for a in (attrs, explicit)]
    outputs = [_session(m).run(None, {"x": x})[0] for m in models]
    np.testing.assert_array_equal(outputs[0], outputs[1])
    upstream = RNG.normal(size=outputs[0].shape).astype(np.float32)
    feeds = {"x": x, "y_grad": upstream} | {k: v.astype(np.float32) for k, v in weights.items()}
    grads = [_session(onnx_derivative(m, inputs=True, fill_grad=False)).run(None, feeds) for m in models]
    for auto, plain in zip(*grads):
        np.testing.assert_array_equal(auto, plain)
    check_gradient(_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **explicit)], {"x": ["N", *xs[1:]]},
                          weights), {"x": _values(xs)})


TRANSPOSED = [
    ("plain", (2, 3, 4, 4), (3, 2, 3, 3), {}),
    ("stride_pads_output_padding", (1, 2, 3, 4), (2, 3, 3, 2), {"strides": [2, 2], "pads": [1, 0, 1, 1],
                                                                 "output_padding": [1, 1]}),
    ("groups_dilation", (1, 4, 3, 3), (4, 1, 2, 2), {"group": 2, "dilations": [2, 1]}),
    ("1d", (2, 2, 5), (2, 3, 3), {"strides": [3], "pads": [1, 0]}),
]


@pytest.mark.parametrize("case", TRANSPOSED, ids=[c[0] for c in TRANSPOSED])
def test_conv_transpose_rule(case):
    _, xs, ws, attrs = case
    channels = ws[1] * attrs.get("group", 1)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    check_gradient(_model([node], {"x": ["N", *xs[1:]]}, {"w": _values(ws), "b": _values((channels,))}),
                   {"x": _values(xs)})


# --- pools ------------------------------------------------------------------------------------------------------
POOLS = [
    ("2x2", (2, 2, 6, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("overlapping_pads", (1, 2, 5, 5), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("ceil_mode", (1, 1, 7, 6), {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("stride_past_end", (1, 2, 7, 7), {"kernel_shape": [2, 2], "strides": [3, 3], "pads": [0, 1, 0, 0]}),
    ("1d", (2, 3, 8), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
]


@pytest.mark.parametrize("indices", [False, True])
@pytest.mark.parametrize("case", POOLS, ids=[c[0] for c in POOLS])
def test_max_pool_rule(case, indices):
    _, xs, attrs = case
    node = helper.make_node("MaxPool", ["x"], ["y", "idx"] if indices else ["y"], **attrs)
    check_gradient(_model([node], {"x": ["N", *xs[1:]]}, {}), {"x": _values(xs)})


def test_max_pool_ties_route_to_one_position():
    """A constant window: the whole gradient goes to one of its positions (MaxPool's index), as torch does."""
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    derivative = onnx_derivative(_model([node], {"x": [1, 1, 4, 4]}, {}), inputs=True, fill_grad=False)
    upstream = np.arange(1.0, 5.0).reshape(1, 1, 2, 2)
    (grad,) = _session(derivative).run(None, {"x": np.ones((1, 1, 4, 4)), "y_grad": upstream})
    assert np.count_nonzero(grad) == 4 and grad.sum() == upstream.sum()


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("case", POOLS, ids=[c[0] for c in POOLS])
def test_average_pool_rule(case, include_pad):
    _, xs, attrs = case
    node = helper.make_node("AveragePool", ["x"], ["y"], count_include_pad=include_pad, **attrs)
    check_gradient(_model([node], {"x": ["N", *xs[1:]]}, {}), {"x": _values(xs)})


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 6)], ids=["2d", "1d"])
def test_global_pool_rules(op, shape):
    check_gradient(_model([helper.make_node(op, ["x"], ["y"])], {"x": ["N", *shape[1:]]}, {}),
                   {"x": _values(shape)})


# --- normalizations and dropout ---------------------------------------------------------------------------------
def test_batch_normalization_inference_rule():
    """Frozen statistics: x, scale, B and the running mean and variance (initializers, so differentiated too)."""
    weights = {"scale": _values(3), "b": _values(3), "mean": _values(3), "var": RNG.uniform(0.5, 2.0, 3)}
    node = helper.make_node("BatchNormalization", ["x", "scale", "b", "mean", "var"], ["y"], epsilon=1e-3)
    check_gradient(_model([node], {"x": ["N", 3, 4, 2]}, weights), {"x": _values((2, 3, 4, 2))})


def test_batch_normalization_training_mode_rule():
    """training_mode=1 normalizes with the batch's statistics; the running statistics outputs are not used.
    onnxruntime's inference build refuses that mode: checked in the reference evaluator only."""
    weights = {"scale": _values(3), "b": _values(3), "mean": _values(3), "var": RNG.uniform(0.5, 2.0, 3)}
    node = helper.make_node("BatchNormalization", ["x", "scale", "b", "mean", "var"], ["y"], training_mode=1)
    model = _model([node], {"x": ["N", 3, 5]}, weights)
    derivative = check_gradient(model, {"x": _values((4, 3, 5))}, onnxruntime=False)
    assert {"mean_grad", "var_grad"} <= {o.name for o in derivative.graph.output}


@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_normalization_rule(axis, bias):
    shape = (2, 3, 4)
    norm = shape[axis % 3:]
    weights = {"scale": _values(norm)} | ({"b": _values(norm)} if bias else {})
    node = helper.make_node("LayerNormalization", ["x", "scale"] + (["b"] if bias else []), ["y"], axis=axis,
                            epsilon=1e-3)
    check_gradient(_model([node], {"x": ["N", *shape[1:]]}, weights), {"x": _values(shape)})


def test_dropout_in_inference_is_the_identity():
    nodes = [_const("ratio", np.array(0.3)), helper.make_node("Dropout", ["x", "ratio"], ["y", "mask"])]
    check_gradient(_model(nodes, {"x": ["N", 3]}, {}), {"x": _values((4, 3))})


def test_dropout_in_training_scales_the_kept_values():
    nodes = [_const("ratio", np.array(0.25)), _const("train", np.array(True)),
             helper.make_node("Dropout", ["x", "ratio", "train"], ["y", "mask"], seed=3)]
    model = _model(nodes, {"x": ["N", 40]}, {}, outputs=("y", "mask"))
    model.graph.output[1].type.tensor_type.elem_type = TensorProto.BOOL
    derivative = onnx_derivative(model, inputs=True, output="y", fill_grad=False, keep_outputs=True)
    x, upstream = _values((5, 40)), RNG.normal(size=(5, 40))
    y, mask, grad = _session(derivative).run(None, {"x": x, "y_grad": upstream})
    assert 0 < mask.sum() < mask.size
    np.testing.assert_allclose(y, x * mask / 0.75, rtol=1e-12)
    np.testing.assert_allclose(grad, upstream * mask / 0.75, rtol=1e-12)
    with pytest.raises(NotDifferentiableError, match="mask output"):
        del model.graph.node[2].output[1]
        del model.graph.output[1]
        onnx_derivative(model, inputs=True)


# --- activations ------------------------------------------------------------------------------------------------
def test_erf_rule():
    check_gradient(_model([helper.make_node("Erf", ["x"], ["y"])], {"x": ["N", 3]}, {}), {"x": _values((4, 3))},
                   elementwise=True)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_rule(approximate):
    node = helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)
    check_gradient(_model([node], {"x": ["N", 3]}, {}, opset=20), {"x": _values((4, 3), 0.05, 3.0)},
                   elementwise=True)


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_max_min_rules(op):
    node = helper.make_node(op, ["x", "w", "v"], ["y"])
    check_gradient(_model([node], {"x": ["N", 3]}, {"w": _values(3), "v": _values((1, 1))}), {"x": _values((4, 3))})


def test_max_of_ties_shares_the_gradient():
    """max(x, x) is x: each operand gets half, together the whole gradient."""
    check_gradient(_model([helper.make_node("Max", ["x", "x"], ["y"])], {"x": ["N", 3]}, {}), {"x": _values((2, 3))})


# --- picks, pads, repeats ---------------------------------------------------------------------------------------
def test_gather_embedding_rule():
    """Rows picked several times add their gradients; the int64 indices get none."""
    node = helper.make_node("Gather", ["w", "tokens"], ["y"])
    tokens = np.array([[0, 3, 3], [4, 0, 3]], dtype=np.int64)
    model = _model([node], {"tokens": (TensorProto.INT64, ["N", 3])}, {"w": _values((5, 2))})
    check_gradient(model, {"tokens": tokens})


@pytest.mark.parametrize("axis,indices", [(1, [[-1, 0], [2, 2]]), (2, [1]), (0, 1), (-1, -2)], ids=str)
def test_gather_rule_along_any_axis(axis, indices):
    nodes = [_ints("idx", indices), helper.make_node("Gather", ["x", "idx"], ["y"], axis=axis)]
    check_gradient(_model(nodes, {"x": [3, 3, 2]}, {}), {"x": _values((3, 3, 2))})


@pytest.mark.parametrize("opset", [13, 18])
def test_split_rule_with_an_unused_output(opset):
    split = {"num_outputs": 3} if opset >= 18 else {}
    nodes = [_ints("sizes", [1, 2, 1]), helper.make_node("Split", ["x", "sizes"], ["a", "b", "c"], axis=1),
             helper.make_node("Split", ["x"], ["d", "e", "f"], axis=0, **split),
             helper.make_node("Mul", ["a", "c"], ["ac"]),
             helper.make_node("Concat", ["ac", "b", "c"], ["m"], axis=1),  # (3, 4) again
             helper.make_node("Tanh", ["e"], ["t"]), helper.make_node("Concat", ["m", "t"], ["y"], axis=0)]
    check_gradient(_model(nodes, {"x": [3, 4]}, {}, opset=opset), {"x": _values((3, 4))})


@pytest.mark.parametrize("pads,axes", [([0, 1, 2, 0, 2, 1], None), ([1, -1, 0, 2], [0, 2])], ids=["pad", "crop_axes"])
def test_pad_rule(pads, axes):
    nodes = [_ints("pads", pads), _const("value", np.array(0.5))]
    inputs = ["x", "pads", "value"]
    if axes is not None:
        nodes.append(_ints("axes", axes))
        inputs.append("axes")
    nodes.append(helper.make_node("Pad", inputs, ["y"]))
    check_gradient(_model(nodes, {"x": [2, 3, 4]}, {}, opset=18), {"x": _values((2, 3, 4))})


def test_tile_rule():
    nodes = [_ints("reps", [2, 1, 3]), helper.make_node("Tile", ["x", "reps"], ["y"])]
    check_gradient(_model(nodes, {"x": ["N", 3, 2]}, {}), {"x": _values((2, 3, 2))})


EINSUMS = [("bhqd,bhkd->bhqk", (2, 2, 3, 4), (2, 2, 5, 4)), ("bhqk,bhkd->bhqd", (2, 2, 3, 5), (2, 2, 5, 4)),
           ("ij,jk", (3, 4), (4, 2)), ("ij,j->i", (3, 4), (4,)), ("ijk,k->", (2, 3, 4), (4,))]


@pytest.mark.parametrize("case", EINSUMS, ids=[c[0] for c in EINSUMS])
def test_einsum_rule(case):
    equation, xs, ws = case
    node = helper.make_node("Einsum", ["x", "w"], ["y"], equation=equation)
    check_gradient(_model([node], {"x": list(xs)}, {"w": _values(ws)}), {"x": _values(xs)})


def test_einsum_letter_summed_alone_is_expanded_back():
    node = helper.make_node("Einsum", ["x"], ["y"], equation="ij->j")
    check_gradient(_model([node], {"x": [3, 4]}, {}), {"x": _values((3, 4))})


# --- graphs with ops lacking a rule -----------------------------------------------------------------------------
def test_every_node_without_rule_is_named_at_once():
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"]), _ints("k", [2]),
             helper.make_node("TopK", ["m", "k"], ["t", "idx"], name="top"),
             helper.make_node("Hardmax", ["t"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])]
    model = _model(nodes, {"x": ["N", 3]}, {"w": _values(3)})
    assert nodes_without_rule(model, ["w"], "y") == ["node 'top' (op TopK)", "node '#3 Hardmax' (op Hardmax)"]
    assert nodes_without_rule(model, [], "y") == []
    with pytest.raises(NotDifferentiableError, match=r"node 'top' \(op TopK\), node '#3 Hardmax' \(op Hardmax\)"):
        onnx_derivative(model)
