"""The two backends: the training build (onnxruntime-training) and the plain onnxruntime. Full training runs
ortflow's own step graph on both (onnxruntime's artifacts on the training build for ops outside ortflow's rules);
forward-backward runs onnxruntime's TrainingAgent or ortflow's split derivative graph."""

import importlib.util
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from sklearn.neural_network import MLPRegressor

import ortflow
from ortflow import (
    NotDifferentiableError,
    OrtGradientForwardBackward,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
    to_onnx,
)
from tolerances import assert_close, float32_sum_atol

TRAINING = ortflow.backend() == "training"


@pytest.fixture(scope="module")
def mlp(regression_data):
    X, y = regression_data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return to_onnx(MLPRegressor(hidden_layer_sizes=(6,), max_iter=2, random_state=0).fit(X[:50], y[:50]))


def _sin_graph() -> "onnx.ModelProto":  # noqa: F821 - Sin: no rule in ortflow, one in onnxruntime-training
    w = numpy_helper.from_array(np.full((8, 1), 0.05, np.float32), "w")
    nodes = [helper.make_node("MatMul", ["X", "w"], ["m"]), helper.make_node("Sin", ["m"], ["Y"], name="sin_1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 8])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_backend_names_the_installed_build():
    has_training = importlib.util.find_spec("onnxruntime.training") is not None
    assert ortflow.backend() == ("training" if has_training else "plain")


def test_trainers_say_what_ran(regression_data, mlp):
    X, y = regression_data
    full = OrtGradientOptimizer(add_loss_output(mlp), max_iter=1).fit(X, y)
    fwbw = OrtGradientForwardBackwardOptimizer(mlp, max_iter=1).fit(X, y)
    assert full.backend_ == fwbw.backend_ == ortflow.backend()
    # gradients='auto' means the same in both trainers: ortflow's graphs (onnxruntime's only for an op outside
    # ortflow's gradient rules, on the training build)
    assert full.gradients_ == fwbw.gradients_ == "ortflow"


@pytest.mark.parametrize("rate", [
    dict(learning_rate=0.02, lr_schedule="invscaling"),
    dict(learning_rate=ortflow.LearningRateAdam(eta0=0.01)),
    dict(learning_rate=ortflow.LearningRateAdamW(eta0=0.01, weight_decay=0.1)),
], ids=["sgd-invscaling", "adam", "adamw"])
def test_full_training_on_own_graph_matches_forward_backward(regression_data, mlp, rate):
    """Two independent implementations on either build: the one-graph step (loss, gradients, update) and
    forward-backward (derivative graph, loss graph, update graph). Shuffled, sample-weighted, validated. Both run
    each optimizer's one rule: the weights agree within the rounding of the magnitudes each step writes."""
    X, y = regression_data
    weight = np.linspace(0.5, 1.5, len(X)).astype(np.float32)
    common = dict(max_iter=3, batch_size=16, random_state=3, validation_fraction=0.2, **rate)
    full = OrtGradientOptimizer(add_loss_output(mlp, weight_name="weight"), gradients="ortflow", **common)
    fwbw = OrtGradientForwardBackwardOptimizer(mlp, gradients="ortflow", **common)
    full.fit(X, y, sample_weight=weight)
    fwbw.fit(X, y, sample_weight=weight)
    steps = 3 * int(np.ceil(0.8 * len(X) / 16))
    for name, value in full.get_state().items():
        start = ortflow.get_initializers(mlp)[name]
        assert_close(fwbw.get_state()[name], value, rtol=1e-4,
                     atol=float32_sum_atol(np.abs(start) + np.abs(value), steps), err_msg=name)
        assert np.abs(value - start).max() > 1e-3  # it trained
    np.testing.assert_allclose(full.validation_losses_, fwbw.validation_losses_, rtol=1e-3)


@pytest.mark.training_build
@pytest.mark.parametrize("learning_rate", [0.02, "adam"])
def test_own_graphs_match_onnxruntimes_on_the_training_build(regression_data, mlp, learning_rate):
    X, y = regression_data
    common = dict(max_iter=2, batch_size=16, random_state=0, learning_rate=learning_rate)
    for cls, graph in ((OrtGradientOptimizer, add_loss_output(mlp)), (OrtGradientForwardBackwardOptimizer, mlp)):
        ours = cls(graph, gradients="ortflow", **common).fit(X, y)
        theirs = cls(graph, gradients="onnxruntime", **common).fit(X, y)
        assert (ours.gradients_, theirs.gradients_) == ("ortflow", "onnxruntime")
        for name, value in theirs.get_state().items():
            np.testing.assert_allclose(ours.get_state()[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_own_forward_backward_graphs_run_in_plain_sessions(regression_data, mlp, tmp_path):
    X, _ = regression_data
    fb = OrtGradientForwardBackward(mlp, input_names_to_train=["X"], gradients="ortflow")
    assert fb.grad_names_[0] == "X_grad" and fb.feed_names_[0] == "X"
    prediction = fb.forward([X[:5]], training=True)[0].numpy()
    grads = dict(zip(fb.grad_names_, (g.numpy() for g in fb.backward([np.ones((5, 1), np.float32)]))))
    # the derivative graph in one session gives the same numbers
    from ortflow._ort import InferenceSession

    sess = InferenceSession(fb.gradient_model_.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"X": X[:5], "variable_grad": np.ones((5, 1), np.float32), **fb.get_weights()}
    expected = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    np.testing.assert_allclose(prediction, expected["variable"], rtol=1e-6)
    for name, value in grads.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-7, err_msg=name)
    for name, path in fb.save_onnx_graph(tmp_path).items():
        if name != "optimized":  # onnxruntime's own rewrite (FusedGemm...), saved for reading
            assert all(n.domain in ("", "ai.onnx") for n in __import__("onnx").load(path).graph.node), name


def test_op_outside_the_rules(regression_data):
    """Plain build: the builder's error naming the node, saying the training build handles more ops. Training
    build: 'auto' falls back to onnxruntime's gradients; 'ortflow' refuses like the plain build."""
    X, y = regression_data
    graph = add_loss_output(_sin_graph())
    with pytest.raises(NotDifferentiableError, match=r"'sin_1' \(op Sin\).*onnxruntime-training differentiates "
                                                     "more ops"):
        OrtGradientOptimizer(graph, gradients="ortflow").fit(X, y)
    if not TRAINING:
        with pytest.raises(NotDifferentiableError, match=r"'sin_1' \(op Sin\).*onnxruntime-training"):
            OrtGradientOptimizer(graph).fit(X, y)
        with pytest.raises(NotDifferentiableError, match=r"'sin_1' \(op Sin\).*onnxruntime-training"):
            OrtGradientForwardBackwardOptimizer(_sin_graph()).fit(X, y)
        return
    est = OrtGradientOptimizer(graph, max_iter=2).fit(X, y)
    assert est.gradients_ == "onnxruntime"
    assert "training_model" in est.save_onnx_graph()
    # forward-backward training: the same meaning of 'auto'
    assert OrtGradientForwardBackwardOptimizer(_sin_graph(), max_iter=2).fit(X, y).gradients_ == "onnxruntime"
    with pytest.raises(NotDifferentiableError, match=r"'sin_1' \(op Sin\)"):
        OrtGradientForwardBackwardOptimizer(_sin_graph(), gradients="ortflow").fit(X, y)


@pytest.mark.skipif(TRAINING, reason="the training build has onnxruntime's gradients")
def test_onnxruntime_gradients_need_the_training_build(regression_data, mlp):
    X, y = regression_data
    with pytest.raises(ImportError, match="gradients='onnxruntime' needs onnxruntime-training"):
        OrtGradientOptimizer(add_loss_output(mlp), gradients="onnxruntime").fit(X, y)
    with pytest.raises(ImportError, match="gradients='onnxruntime' needs onnxruntime-training"):
        OrtGradientForwardBackwardOptimizer(mlp, gradients="onnxruntime").fit(X, y)


def test_weight_reached_only_through_an_op_without_gradient_is_refused(regression_data):
    from ortflow.autodiff import training_step

    w = numpy_helper.from_array(np.ones((8, 1), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["X", "w"], ["m"]), helper.make_node("Sign", ["m"], ["Y"], name="sign_1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 8])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(NotDifferentiableError, match=r"node 'sign_1' \(op Sign\) has no gradient.*\['w'\]"):
        training_step(add_loss_output(model))
    with pytest.raises(NotDifferentiableError, match=r"node 'sign_1' \(op Sign\) has no gradient"):
        OrtGradientForwardBackward(model, gradients="ortflow")
