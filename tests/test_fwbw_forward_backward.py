"""OrtGradientForwardBackward: gradients of real graphs against numpy, errors, exported graphs."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from sklearn.linear_model import LinearRegression
from sklearn.neural_network import MLPRegressor

from ortflow import DeviceError, NotDifferentiableError, to_onnx
from ortflow._ort import TRAINING
from ortflow import OrtGradientForwardBackward
from tolerances import assert_close, float32_sum_atol, matmul_atol, sum_atol


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(12, 4)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.3).astype(np.float32)
    return X, y


def test_linear_gradients_of_weights_and_input(small):
    X, y = small
    model = LinearRegression().fit(X, y)
    fb = OrtGradientForwardBackward(to_onnx(model), input_names_to_train=["X"])
    assert fb.grad_names_ == ["X_grad", "coef_grad", "intercept_grad"]
    pred = fb.forward([X], training=True)[0].numpy()
    ones = np.ones((len(X), 1))
    assert_close(pred.ravel(), model.predict(X), atol=matmul_atol(np.hstack([X, ones]),
                                                                  np.r_[model.coef_, model.intercept_]))
    g = np.random.default_rng(2).normal(size=pred.shape).astype(np.float32)
    gx, gw, gb = (v.numpy() for v in fb.backward([g]))
    assert_close(gw, X.T @ g.astype(np.float64), atol=matmul_atol(X.T, g))
    assert_close(gb, g.sum(axis=0, dtype=np.float64), atol=sum_atol(g))
    assert_close(gx, g @ model.coef_.reshape(1, -1), atol=matmul_atol(g, model.coef_.reshape(1, -1)))


def test_mlp_gradients_match_manual_backprop(small):
    X, y = small
    mlp = MLPRegressor(hidden_layer_sizes=(5,), max_iter=3, random_state=0)
    with pytest.warns(Warning):
        mlp.fit(X, y)
    fb = OrtGradientForwardBackward(to_onnx(mlp))
    W0, b0, W1, b1 = mlp.coefs_[0], mlp.intercepts_[0], mlp.coefs_[1], mlp.intercepts_[1]
    pre = X @ W0 + b0
    hidden = np.maximum(pre, 0)
    g = np.ones((len(X), 1), dtype=np.float32) / len(X)
    out = fb.forward([X], training=True)[0].numpy()
    # float32 rounding of the hidden layer, carried through the second layer's weights
    hidden_atol = matmul_atol(np.hstack([X, np.ones((len(X), 1))]), np.vstack([W0, b0]))
    assert_close(out, hidden @ W1 + b1, atol=matmul_atol(hidden, W1) + hidden_atol @ np.abs(W1))
    grads = dict(zip(fb.grad_names_, (v.numpy() for v in fb.backward([g]))))
    gh = (g @ W1.T) * (pre > 0)
    assert_close(grads["coef_1_grad"], hidden.T @ g, atol=matmul_atol(hidden.T, g) + hidden_atol.T @ np.abs(g))
    assert_close(grads["intercept_1_grad"], g.sum(axis=0), atol=sum_atol(g))
    gh_atol = matmul_atol(np.abs(g), np.abs(W1.T))
    assert_close(grads["coef_0_grad"], X.T @ gh, atol=matmul_atol(X.T, gh) + np.abs(X.T) @ gh_atol)
    assert_close(grads["intercept_0_grad"], gh.sum(axis=0), atol=sum_atol(gh) + gh_atol.sum(axis=0))


def test_weights_are_owned_and_replaceable(small):
    X, _ = small
    model = LinearRegression().fit(X, X[:, 0])
    fb = OrtGradientForwardBackward(to_onnx(model), weights_to_train=["coef"])
    assert list(fb.get_weights()) == ["coef"]
    fb.set_weights({"coef": np.zeros((4, 1))})
    np.testing.assert_allclose(fb.forward([X])[0].numpy(), np.full((len(X), 1), model.intercept_), atol=1e-6)
    with pytest.raises(KeyError, match="not a trained weight"):
        fb.set_weights({"intercept": np.zeros(1)})
    with pytest.raises(ValueError, match="has shape"):
        fb.set_weights({"coef": np.zeros(4)})


def test_backward_needs_a_training_forward(small):
    X, _ = small
    fb = OrtGradientForwardBackward(to_onnx(LinearRegression().fit(X, X[:, 0])))
    with pytest.raises(RuntimeError, match="forward"):
        fb.backward([np.ones((len(X), 1), dtype=np.float32)])
    fb.forward([X], training=False)
    with pytest.raises(RuntimeError, match="forward"):
        fb.backward([np.ones((len(X), 1), dtype=np.float32)])
    with pytest.raises(ValueError, match="expects 1 inputs"):
        fb.forward([X, X])


def _round_graph(name="round_node"):
    coef = numpy_helper.from_array(np.ones((3, 1), np.float32), "coef")
    bias = numpy_helper.from_array(np.ones((1,), np.float32), "bias")
    nodes = [
        helper.make_node("MatMul", ["X", "coef"], ["m"]),
        helper.make_node("Round", ["m"], ["r"], name=name),
        helper.make_node("Add", ["r", "bias"], ["Y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [None, 3])],
                              [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [None, 1])], [coef, bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_node_without_gradient_is_named():
    with pytest.raises(NotDifferentiableError, match=r"'round_node' \(op Round\)"):
        OrtGradientForwardBackward(_round_graph())
    with pytest.raises(NotDifferentiableError, match=r"'Round_1' \(op Round\)"):  # unnamed nodes get a name
        OrtGradientForwardBackward(_round_graph(name=""))
    # the weight after the Round still trains
    fb = OrtGradientForwardBackward(_round_graph(), weights_to_train=["bias"])
    assert fb.grad_names_ == ["bias_grad"]


def test_save_onnx_graph_writes_loadable_graphs(tmp_path, small):
    X, _ = small
    # the builder of each build that has it: onnxruntime's on the training build, ortflow's on the plain one
    fb = OrtGradientForwardBackward(to_onnx(LinearRegression().fit(X, X[:, 0])),
                                    gradients="onnxruntime" if TRAINING else "ortflow")
    paths = fb.save_onnx_graph(tmp_path / "g")
    assert set(paths) == {"model", "forward", "training", "backward", "optimized"}
    for name, path in paths.items():
        proto = onnx.load(path)
        assert len(proto.graph.node) > 0, name
    if fb.gradients_ == "onnxruntime":  # onnxruntime's training graph: forward, YieldOp, backward
        assert any(n.op_type == "YieldOp" for n in onnx.load(paths["training"]).graph.node)
    else:  # ortflow's derivative graph: standard ONNX only
        assert all(n.domain in ("", "ai.onnx") for n in onnx.load(paths["training"]).graph.node)
    backward = onnx.load(paths["backward"])
    assert [o.name for o in backward.graph.output] == fb.grad_names_
    # the forward graph runs in a plain session once the weights are fed
    sess = ort.InferenceSession(paths["model"], providers=["CPUExecutionProvider"])
    feeds = {"X": X, **fb.get_weights()}
    np.testing.assert_allclose(sess.run(None, feeds)[0], fb.forward([X])[0].numpy(), rtol=1e-6)


def test_unknown_input_or_device_is_refused(small):
    X, _ = small
    onx = to_onnx(LinearRegression().fit(X, X[:, 0]))
    with pytest.raises(ValueError, match="not inputs"):
        OrtGradientForwardBackward(onx, input_names_to_train=["Z"])
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(DeviceError, match="no CUDA provider"):
            OrtGradientForwardBackward(onx, device="cuda")
    with pytest.raises(DeviceError):
        OrtGradientForwardBackward(onx, device="tpu")


def _agent_step(fb, agent, cache, X, grad_output):
    """Forward then backward through ``agent`` (a TrainingAgent of ``fb``), returning prediction and gradients."""
    from ortflow._ort import OrtValue, OrtValueVector, PartialGraphExecutionState
    from ortflow.runtime.sessions import to_ortvalue

    x = to_ortvalue(X)
    feeds = fb.feed_vector({"X": x, **fb.weights})
    fetches, grads, bw_feeds, state = OrtValueVector(), OrtValueVector(), OrtValueVector(), PartialGraphExecutionState()
    agent.run_forward(feeds, fetches, state, cache)
    g = to_ortvalue(grad_output)
    bw_feeds.push_back(g._ortvalue)
    agent.run_backward(bw_feeds, grads, state)
    return OrtValue(fetches[0]).numpy(), [OrtValue(grads[i]).numpy() for i in range(len(fb.grad_names_))]


@pytest.mark.training_build
def test_static_agent_drops_broadcast_bookkeeping_and_keeps_gradients(small, tmp_path):
    X, y = small
    mlp = MLPRegressor(hidden_layer_sizes=(6,), max_iter=3, random_state=0)
    with pytest.warns(Warning):
        mlp.fit(X, y)
    fb = OrtGradientForwardBackward(to_onnx(mlp), gradients="onnxruntime")  # its graphs hold the bookkeeping
    g = np.random.default_rng(3).normal(size=(len(X), 1)).astype(np.float32)
    agent, cache = fb.static_agent([X.shape])
    assert fb.static_agent([X.shape])[0] is agent  # built once per shape
    static_pred, static_grads = _agent_step(fb, agent, cache, X, g)
    dynamic_pred, dynamic_grads = _agent_step(fb, fb.agent_, fb.cache_, X, g)
    np.testing.assert_allclose(static_pred, dynamic_pred, rtol=1e-6)
    for name, a, b in zip(fb.grad_names_, static_grads, dynamic_grads):
        # two graphs of the same sums: within the rounding of the largest gradient's terms (|X| and |g| ~ 1)
        assert_close(a, b, atol=float32_sum_atol(np.abs(b).max() + 1.0, len(X)), err_msg=name)
    ops = lambda model: {n.op_type for n in model.graph.node}  # noqa: E731
    assert "BroadcastGradientArgs" in ops(fb.gradient_model_)
    paths = fb.save_onnx_graph(tmp_path)
    assert "BroadcastGradientArgs" not in ops(onnx.load(paths["training_12x4"]))
    # a shape the graph cannot take falls back to the shape-agnostic agent, with the reason kept
    assert fb.static_agent([(12, 7)])[0] is fb.agent_
    assert (12, 7) in next(iter(fb.static_failures_))
    with pytest.raises(ValueError, match="expects 1 shapes"):
        fb.static_agent([X.shape, X.shape])


def test_own_graphs_differentiate_several_outputs(two_output_graph):
    """Both float outputs take an upstream gradient; the int64 one (ArgMax) is non-differentiable. Checked against
    the gradients written out by hand in numpy."""
    fb = OrtGradientForwardBackward(two_output_graph, weights_to_train=["layer.0/W", "c", "V"],
                                    input_names_to_train=["a"], gradients="ortflow")
    assert fb.non_differentiable_ == [2] and fb.grad_names_ == ["a_grad", "layer.0/W_grad", "c_grad", "V_grad"]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((5, 2)).astype(np.float32)
    gy, gz = rng.standard_normal((5, 1)).astype(np.float32), rng.standard_normal((5, 2)).astype(np.float32)
    y, z, idx = (o.numpy() for o in fb.forward([a, b], training=True))
    da, dW, dc, dV = (g.numpy() for g in fb.backward([gy, gz]))
    w = {i.name: numpy_helper.to_array(i) for i in two_output_graph.graph.initializer}
    pre = a @ w["layer.0/W"] + w["c"]
    hb = np.maximum(pre, 0) * b
    pre_atol = matmul_atol(np.hstack([a, np.ones((len(a), 1))]), np.vstack([w["layer.0/W"], w["c"]]))
    assert_close(y, hb @ w["V"], atol=matmul_atol(hb, w["V"]) + (pre_atol * np.abs(b)) @ np.abs(w["V"]))
    np.testing.assert_array_equal(idx, np.argmax(a @ w["layer.0/W"] + w["frozen"], axis=1))
    dpre = (gy @ w["V"].T) * b * (pre > 0)
    daw = dpre + gz  # both outputs read a @ W
    W = w["layer.0/W"]
    dpre_atol = matmul_atol(np.abs(gy), np.abs(w["V"].T)) * np.abs(b)
    checks = ((dV, hb.T @ gy, matmul_atol(hb.T, gy)), (dc, dpre.sum(0), sum_atol(dpre) + dpre_atol.sum(0)),
              (dW, a.T @ daw, matmul_atol(a.T, daw) + np.abs(a.T) @ dpre_atol),
              (da, daw @ W.T, matmul_atol(daw, W.T) + dpre_atol @ np.abs(W.T)))
    for got, expected, atol in checks:
        assert_close(got, expected, atol=atol)
