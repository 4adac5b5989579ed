"""ortflow's own gradient graphs, one op at a time: each rule against numpy central finite differences on float64
graphs, run in a plain InferenceSession; broadcasting with static and symbolic shapes; errors."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortflow import NotDifferentiableError, onnx_derivative
from ortflow._ort import InferenceSession as _InferenceSession
from ortflow._ort import SessionOptions, ort

D = TensorProto.DOUBLE
RNG = np.random.default_rng(0)


def InferenceSession(serialized):
    """A session without onnxruntime's extended fusions: they write com.microsoft ops (FusedMatMul) with float32
    kernels only, and these graphs are float64."""
    options = SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return _InferenceSession(serialized, options, providers=["CPUExecutionProvider"])


def _model(nodes, inputs, weights, output="y", opset=17):
    """A float64 graph: ``inputs`` name -> declared shape, ``weights`` name -> array (initializers)."""
    graph = helper.make_graph(
        nodes, "case", [helper.make_tensor_value_info(n, D, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(output, D, None)],
        [numpy_helper.from_array(np.asarray(v, dtype=np.float64), n) for n, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _values(shape, low=0.2, high=1.5, signed=True):
    """Values away from 0 (the kinks of Relu/Abs/Clip) so that finite differences are exact enough."""
    x = RNG.uniform(low, high, size=shape)
    return x * RNG.choice([-1.0, 1.0], size=shape) if signed else x


def check_gradient(model, feeds, output="y", rtol=1e-6):
    """The derivative graph's gradients of sum(y * G) for a random G equal central finite differences."""
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.data_type == D}
    derivative = onnx_derivative(model, inputs=True, output=output, fill_grad=False)
    forward = InferenceSession(_weights_as_inputs(model).SerializeToString())
    sess = InferenceSession(derivative.SerializeToString())
    y = forward.run(None, {**feeds, **weights})[0]
    upstream = RNG.normal(size=y.shape)
    got = dict(zip([o.name for o in sess.get_outputs()],
                   sess.run(None, {**feeds, **weights, f"{output}_grad": upstream})))
    values = {**feeds, **weights}
    for name, expected in finite_differences(lambda v: forward.run(None, v)[0], values, upstream).items():
        value = values[name]
        assert got[f"{name}_grad"].shape == value.shape, name
        np.testing.assert_allclose(got[f"{name}_grad"], expected, rtol=rtol, atol=1e-7, err_msg=name)
    return derivative


def finite_differences(run, values, upstream, step=1e-6):
    """Central finite differences of ``sum(run(values) * upstream)`` for every float64 array of ``values``."""
    grads = {}
    for name, value in values.items():
        if value.dtype != np.float64:
            continue
        grads[name] = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            sums = []
            for signed in (step, -step):
                moved = value.copy()
                moved[idx] += signed
                sums.append(np.sum(run({**values, name: moved}) * upstream))
            grads[name][idx] = (sums[0] - sums[1]) / (2 * step)
    return grads


def _weights_as_inputs(model):
    new = onnx.ModelProto()
    new.CopyFrom(model)
    floats = [i for i in new.graph.initializer if i.data_type == D]
    new.graph.input.extend(helper.make_tensor_value_info(i.name, D, list(i.dims)) for i in floats)
    kept = [i for i in new.graph.initializer if i.data_type != D]
    del new.graph.initializer[:]
    new.graph.initializer.extend(kept)
    return new


def _unary(op, x, **attrs):
    return _model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": ["N", x.shape[1]]}, {}), {"x": x}


UNARY = [
    ("Identity", {}, True), ("Neg", {}, True), ("Relu", {}, True), ("LeakyRelu", {"alpha": 0.2}, True),
    ("Tanh", {}, True), ("Sigmoid", {}, True), ("Exp", {}, True), ("Log", {}, False), ("Abs", {}, True),
    ("Sqrt", {}, False), ("Reciprocal", {}, True), ("Softmax", {}, True), ("Softmax", {"axis": 0}, True),
    ("LogSoftmax", {}, True), ("LogSoftmax", {"axis": 0}, True), ("Flatten", {}, True),
    ("Transpose", {}, True), ("Transpose", {"perm": [1, 0]}, True), ("Cast", {"to": D}, True),
]


@pytest.mark.parametrize("op,attrs,signed", UNARY, ids=[f"{o}{a or ''}" for o, a, _ in UNARY])
def test_unary_rules(op, attrs, signed):
    model, feeds = _unary(op, _values((4, 3), signed=signed), **attrs)
    check_gradient(model, feeds)


def test_softplus_rule():
    # onnxruntime has no float64 Softplus kernel: float32, against the exact derivative sigmoid(x)
    x = _values((3, 4)).astype(np.float32)
    model = _retype(_model([helper.make_node("Softplus", ["x"], ["y"])], {"x": ["N", 4]}, {}), TensorProto.FLOAT)
    sess = InferenceSession(onnx_derivative(model, inputs=True).SerializeToString())
    (grad,) = sess.run(None, {"x": x, "y_grad": np.ones_like(x)})
    np.testing.assert_allclose(grad, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)


def _retype(model, elem):
    for value in list(model.graph.input) + list(model.graph.output):
        value.type.tensor_type.elem_type = elem
    return model


BINARY_SHAPES = [((4, 3), (4, 3)), ((4, 3), (3,)), ((4, 3), (1, 3)), ((4, 3), (4, 1)), ((2, 4, 3), (4, 1)),
                 ((4, 3), ())]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Sum"])
@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=str)
def test_broadcasting_binary_rules(op, shapes):
    """The operand in the weights is broadcast against a symbolic batch: its gradient is summed back."""
    xs, ws = shapes
    model = _model([helper.make_node(op, ["x", "w"], ["y"])], {"x": ["N"] + list(xs[1:])}, {"w": _values(ws)})
    check_gradient(model, {"x": _values(xs)})


def test_value_used_several_times_accumulates():
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("Mul", ["sq", "w"], ["t"]),
             helper.make_node("Add", ["t", "x"], ["u"]), helper.make_node("Tanh", ["u"], ["v"]),
             helper.make_node("Sub", ["v", "w"], ["y"])]
    check_gradient(_model(nodes, {"x": [None, 3]}, {"w": _values((3,))}), {"x": _values((5, 3))})


def test_symbolic_batches_broadcast_at_run_time():
    """(N, 1) - (M, 1) with N = 1 and M = 5: the first operand's gradient is summed over the 5 rows."""
    model = _model([helper.make_node("Sub", ["a", "b"], ["d"]), helper.make_node("Mul", ["d", "d"], ["y"])],
                   {"a": ["N", 1], "b": ["M", 1]}, {})
    derivative = check_gradient(model, {"a": _values((1, 1)), "b": _values((5, 1))})
    assert "NonZero" in {n.op_type for n in derivative.graph.node}
    check_gradient(model, {"a": _values((5, 1)), "b": _values((5, 1))})
    check_gradient(model, {"a": _values((5, 1)), "b": _values((1, 1))})


def test_static_broadcast_needs_no_run_time_axes():
    model = _model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                   {"x": [None, 3]}, {"w": _values((3, 2)), "b": _values((2,))})
    derivative = check_gradient(model, {"x": _values((4, 3))})
    assert not {"NonZero", "Shape"} & {n.op_type for n in derivative.graph.node}


MATMULS = [((4, 3), (3, 2)), ((2, 4, 3), (3, 2)), ((2, 4, 3), (2, 3, 5)), ((4, 3), (2, 3, 5)), ((4, 3), (3,)),
           ((2, 4, 3), (3,)), ((3,), (3, 2)), ((3,), (2, 3, 4)), ((3,), (3,)), ((1, 4, 3), (2, 3, 5))]


@pytest.mark.parametrize("shapes", MATMULS, ids=str)
def test_matmul_rule(shapes):
    xs, ws = shapes
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": list(xs)}, {"w": _values(ws)})
    check_gradient(model, {"x": _values(xs)})


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [(2,), (1, 2), (4, 2), None])
def test_gemm_rule(trans_a, trans_b, c_shape):
    a, b = _values((3, 4) if trans_a else (4, 3)), _values((2, 3) if trans_b else (3, 2))
    weights = {"b": b} if c_shape is None else {"b": b, "c": _values(c_shape)}
    node = helper.make_node("Gemm", ["a", "b"] + ([] if c_shape is None else ["c"]), ["y"], alpha=0.7, beta=1.3,
                            transA=trans_a, transB=trans_b)
    check_gradient(_model([node], {"a": list(a.shape)}, weights), {"a": a})


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
@pytest.mark.parametrize("axes", [None, [1], [0, 2], [-1]])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [13, 18])
def test_reduce_rules(op, axes, keepdims, opset):
    as_input = opset >= (13 if op == "ReduceSum" else 18)
    nodes = []
    if axes is not None and as_input:
        nodes.append(_const("axes", np.array(axes, dtype=np.int64)))
        nodes.append(helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims))
    elif axes is not None:
        nodes.append(helper.make_node(op, ["x"], ["y"], keepdims=keepdims, axes=axes))
    else:
        nodes.append(helper.make_node(op, ["x"], ["y"], keepdims=keepdims))
    check_gradient(_model(nodes, {"x": ["N", 3, 2]}, {}, opset=opset), {"x": _values((4, 3, 2))})


def test_pow_with_constant_exponent():
    nodes = [_const("e", np.array(2.5)), helper.make_node("Pow", ["x", "e"], ["p"]),
             helper.make_node("Pow", ["p", "k"], ["y"])]
    model = _model(nodes, {"x": [None, 3]}, {})
    model.graph.initializer.append(numpy_helper.from_array(np.array([1, 2, 3], dtype=np.int64), "k"))
    check_gradient(model, {"x": _values((4, 3), signed=False)})


def test_shape_ops():
    nodes = [_const("shape", np.array([-1, 6], dtype=np.int64)), helper.make_node("Reshape", ["x", "shape"], ["r"]),
             _const("ax", np.array([0], dtype=np.int64)), helper.make_node("Unsqueeze", ["r", "ax"], ["u"]),
             helper.make_node("Squeeze", ["u", "ax"], ["s"]),
             helper.make_node("Concat", ["s", "w", "s"], ["c"], axis=1),
             _const("st", np.array([1, -1], dtype=np.int64)), _const("en", np.array([100, -100], dtype=np.int64)),
             _const("sa", np.array([1, 0], dtype=np.int64)), _const("sp", np.array([2, -3], dtype=np.int64)),
             helper.make_node("Slice", ["c", "st", "en", "sa", "sp"], ["sl"]),  # (1, 8)
             _const("big", np.array([3, 5, 8], dtype=np.int64)), helper.make_node("Expand", ["sl", "big"], ["y"])]
    check_gradient(_model(nodes, {"x": ["N", 2, 3]}, {"w": _values((2, 4))}), {"x": _values((2, 2, 3))})


def test_where_and_clip():
    nodes = [helper.make_node("Greater", ["x", "w"], ["cond"]), helper.make_node("Where", ["cond", "x", "w"], ["m"]),
             _const("lo", np.array(-0.5)), _const("hi", np.array(0.8)),
             helper.make_node("Clip", ["m", "lo", "hi"], ["y"])]
    check_gradient(_model(nodes, {"x": ["N", 3]}, {"w": _values((3,))}), {"x": _values((5, 3))})


def test_non_float_paths_carry_no_gradient():
    """relu_as_mask's x * Cast(x > 0), a Shape computation and Sign: only the float path is differentiated."""
    nodes = [_const("zero", np.array(0.0)), helper.make_node("Greater", ["x", "zero"], ["pos"]),
             helper.make_node("Cast", ["pos"], ["mask"], to=D), helper.make_node("Mul", ["x", "mask"], ["r"]),
             helper.make_node("Shape", ["r"], ["shape"]), helper.make_node("Sign", ["w"], ["sw"]),
             helper.make_node("Mul", ["r", "sw"], ["m"]), helper.make_node("Reshape", ["m", "shape"], ["y"])]
    check_gradient(_model(nodes, {"x": ["N", 3]}, {"w": _values((3,))}), {"x": _values((4, 3))})


def test_unused_weight_gets_zeros():
    model = _model([helper.make_node("Mul", ["x", "w"], ["y"])], {"x": ["N", 3]}, {"w": _values((3,)),
                                                                              "unused": _values((2, 2))})
    sess = InferenceSession(onnx_derivative(model, fill_grad=True).SerializeToString())
    out = dict(zip([o.name for o in sess.get_outputs()],
                   sess.run(None, {"x": np.ones((4, 3)), "w": np.ones(3), "unused": np.ones((2, 2))})))
    np.testing.assert_array_equal(out["unused_grad"], np.zeros((2, 2)))
    np.testing.assert_array_equal(out["w_grad"], np.full(3, 4.0))


def test_weights_kept_as_initializers_and_outputs_kept():
    w = _values((3,))
    model = _model([helper.make_node("Mul", ["x", "w"], ["y"])], {"x": ["N", 3]}, {"w": w})
    derivative = onnx_derivative(model, weights_as_inputs=False, keep_outputs=True, fill_grad=True)
    assert [i.name for i in derivative.graph.input] == ["x"]
    x = _values((2, 3))
    y, grad = InferenceSession(derivative.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(y, x * w)
    np.testing.assert_allclose(grad, x.sum(axis=0))


def test_op_without_rule_is_named():
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"]), _const("k", np.array([2], dtype=np.int64)),
             helper.make_node("TopK", ["m", "k"], ["y", "idx"])]
    model = _model(nodes, {"x": ["N", 3]}, {"w": _values((3,))})
    with pytest.raises(NotDifferentiableError, match=r"node '#2 TopK' \(op TopK\)"):
        onnx_derivative(model)
    model.graph.node[2].name = "top"
    with pytest.raises(NotDifferentiableError, match=r"node 'top' \(op TopK\)"):
        onnx_derivative(model)
    # the same op off the differentiated path is fine
    onnx_derivative(model, output="y", weights=[], inputs=False)


def test_ml_op_without_rule_is_named():
    node = helper.make_node("LinearRegressor", ["x"], ["y"], domain="ai.onnx.ml", coefficients=[1.0, 2.0, 3.0])
    graph = helper.make_graph([node], "ml", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)],
                              ir_version=8)
    with pytest.raises(NotDifferentiableError, match=r"node '#0 LinearRegressor' \(op ai.onnx.ml.LinearRegressor\)"):
        onnx_derivative(model, weights=[], inputs=True)


def test_op_of_unknown_type_on_the_path_is_refused_not_ignored():
    """onnx cannot infer com.microsoft ops: their outputs are untyped, still on the path."""
    nodes = [helper.make_node("FusedMatMul", ["x", "w"], ["m"], domain="com.microsoft"),
             helper.make_node("Tanh", ["m"], ["y"])]
    model = _model(nodes, {"x": ["N", 3]}, {"w": _values((3, 2))})
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(NotDifferentiableError, match=r"node '#0 FusedMatMul' \(op com.microsoft.FusedMatMul\)"):
        onnx_derivative(model)


def test_bad_arguments_are_named():
    model = _model([helper.make_node("Mul", ["x", "w"], ["y"])], {"x": ["N", 3]}, {"w": _values((3,))})
    with pytest.raises(ValueError, match=r"weights names \['nope'\]"):
        onnx_derivative(model, weights=["nope"])
    with pytest.raises(ValueError, match=r"inputs names \['w'\]"):
        onnx_derivative(model, inputs=["w"])
    with pytest.raises(ValueError, match="output='z'"):
        onnx_derivative(model, output="z")


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_before_opset_13_normalizes_every_axis_from_axis_on(op):
    model = _model([helper.make_node(op, ["x"], ["y"], axis=1)], {"x": ["N", 3, 2]}, {}, opset=11)
    check_gradient(model, {"x": _values((2, 3, 2))})


def test_clip_bounds_as_attributes_before_opset_11():
    # onnxruntime's Clip-6 has float32 kernels only: compared with the mask of the kept values
    model = _retype(_model([helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.8)], {"x": ["N", 3]}, {},
                           opset=10), TensorProto.FLOAT)
    x = _values((5, 3)).astype(np.float32)
    upstream = RNG.normal(size=x.shape).astype(np.float32)
    sess = InferenceSession(onnx_derivative(model, inputs=True).SerializeToString())
    (grad,) = sess.run(None, {"x": x, "y_grad": upstream})
    np.testing.assert_array_equal(grad, upstream * ((x >= -0.5) & (x <= 0.8)))
