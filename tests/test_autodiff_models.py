"""ortflow's own gradient graphs on every ``ortflow.to_onnx`` output with every loss and penalty of
``add_loss_output``: equal to onnxruntime-training's gradients (``OrtGradientForwardBackward``) on the same
float32 graphs."""

import warnings

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
from sklearn.neural_network import MLPClassifier, MLPRegressor

import ortflow
from ortflow._ort import InferenceSession
from ortflow import OrtGradientForwardBackward
from tolerances import assert_close, float32_sum_atol

REGRESSORS = {
    "linear": lambda: LinearRegression(),
    "ridge": lambda: Ridge(alpha=0.5),
    "mlp_relu": lambda: MLPRegressor(hidden_layer_sizes=(6, 4), activation="relu", max_iter=5, random_state=0),
    "mlp_tanh": lambda: MLPRegressor(hidden_layer_sizes=(5,), activation="tanh", max_iter=5, random_state=0),
    "mlp_logistic": lambda: MLPRegressor(hidden_layer_sizes=(5,), activation="logistic", max_iter=5, random_state=0),
}
CLASSIFIERS = {
    "logistic": lambda: LogisticRegression(),
    "mlp_classifier": lambda: MLPClassifier(hidden_layer_sizes=(6,), max_iter=5, random_state=0),
}


def _fitted(make, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make().fit(X, y)


def _ours(loss_model, feeds, per_row=False):
    """Our gradients of ``loss_model`` at ``feeds``; with ``per_row``, also the mean over rows of the absolute
    gradient of each row alone: the magnitude of the terms the batch gradient sums (a mean loss)."""
    derivative = ortflow.onnx_derivative(loss_model)
    forward = {o for n in loss_model.graph.node for o in n.output}
    added = {(n.domain, n.op_type) for n in derivative.graph.node if not forward.intersection(n.output)}
    assert {d for d, _ in added} <= {""}, added  # the gradient is standard ONNX
    ops = {n.op_type for n in derivative.graph.node}
    assert not {"ArgMax", "Gather"} & ops  # a classifier's label branch is pruned
    sess = InferenceSession(derivative.SerializeToString(), providers=["CPUExecutionProvider"])
    weights = ortflow.get_initializers(loss_model)
    weights = {w: weights[w] for w in ortflow.trainable_initializers(loss_model)}
    names = [o.name for o in sess.get_outputs()]
    grads = dict(zip(names, sess.run(None, {**feeds, **weights})))
    if not per_row:
        return grads
    rows = len(next(iter(feeds.values())))
    terms = {name: np.zeros(np.shape(value), np.float64) for name, value in grads.items()}
    for i in range(rows):
        one = sess.run(None, {**{k: v[i: i + 1] for k, v in feeds.items()}, **weights})
        for name, value in zip(names, one):
            terms[name] += np.abs(value.astype(np.float64)) / rows
    return grads, terms


def _training_build(loss_model, feeds):
    fb = OrtGradientForwardBackward(loss_model, device="cpu", gradients="onnxruntime")
    outputs = fb.forward([feeds[name] for name in fb.input_names_], training=True)
    upstream = [np.ones((), np.float32) if i == 0 else np.zeros_like(out.numpy())
                for i, out in enumerate(outputs) if i not in fb.non_differentiable_]
    return {name: grad.numpy() for name, grad in zip(fb.grad_names_, fb.backward(upstream))}


def _compare(loss_model, feeds):
    """Ours against the training build's, element by element within the float32 rounding of the sum over rows
    (tests/tolerances.py): a gradient near zero at a near-optimum is a sum that cancels, and its rounding is set by
    the terms summed, which differ by CPU, not by the result."""
    (ours, terms), theirs = _ours(loss_model, feeds, per_row=True), _training_build(loss_model, feeds)
    assert sorted(ours) == sorted(theirs)
    rows = len(next(iter(feeds.values())))
    for name, expected in theirs.items():
        atol = float32_sum_atol(terms[name], rows)
        assert_close(ours[name], expected, rtol=1e-5, atol=atol, err_msg=name)
    return ours


def _off_target(y):
    """Labels the fitted model does not fit: at its optimum a linear model's gradient is rounding noise."""
    return (0.5 * y + 0.3).reshape(-1, 1).astype(np.float32)


def _penalties(model):
    first = ortflow.trainable_initializers(model)[0]
    return [None, {first: {"l1": 0.05}}, {first: {"l2": 0.05}}]


@pytest.mark.parametrize("kind", sorted(REGRESSORS))
@pytest.mark.parametrize("score", ["squared_error", "absolute_error", "elastic"])
@pytest.mark.training_build
def test_regressors_match_training_build(regression_data, kind, score):
    X, y = regression_data
    X, y = X[:40], y[:40]
    model = ortflow.to_onnx(_fitted(REGRESSORS[kind], X, y), X)
    for penalty in _penalties(model):
        loss = ortflow.add_loss_output(model, score, penalty=penalty)
        _compare(loss, {"X": X, "label": _off_target(y)})


@pytest.mark.parametrize("kind", sorted(CLASSIFIERS))
@pytest.mark.training_build
def test_binary_classifiers_match_training_build(classification_data, kind):
    X, y = classification_data
    X, y = X[:40], y[:40]
    model = ortflow.to_onnx(_fitted(CLASSIFIERS[kind], X, y), X)
    for penalty in _penalties(model):
        loss = ortflow.add_loss_output(model, "log", penalty=penalty)
        _compare(loss, {"X": X, "label": y.reshape(-1, 1).astype(np.float32)})


@pytest.mark.parametrize("kind", sorted(CLASSIFIERS))
@pytest.mark.training_build
def test_multiclass_classifiers_match_training_build(kind):
    """Softmax classifiers: log loss over one-hot labels (LogSoftmax in the loss graph)."""
    from sklearn.datasets import make_classification

    X, y = make_classification(60, n_features=6, n_informative=4, n_classes=3, random_state=0)
    X = X.astype(np.float32)
    model = ortflow.to_onnx(_fitted(CLASSIFIERS[kind], X, y), X)
    onehot = np.eye(3, dtype=np.float32)[y]
    for penalty in _penalties(model):
        _compare(ortflow.add_loss_output(model, "log", penalty=penalty), {"X": X, "label": onehot})


@pytest.mark.training_build
def test_sample_weights_match_training_build(regression_data):
    X, y = regression_data
    X, y = X[:30], y[:30]
    model = ortflow.to_onnx(_fitted(REGRESSORS["mlp_relu"], X, y), X)
    loss = ortflow.add_loss_output(model, "elastic", weight_name="weight")
    w = np.linspace(0.5, 2.0, len(X)).astype(np.float32)
    _compare(loss, {"X": X, "label": _off_target(y), "weight": w})


@pytest.mark.training_build
def test_combined_penalties_are_the_sum_of_single_ones(regression_data):
    """l1 + l2 on two weights joins the terms with Sum, which the training build cannot differentiate
    (issue 12): our gradient equals the sum of the training build's single-penalty gradients."""
    X, y = regression_data
    X, y = X[:40], y[:40]
    model = ortflow.to_onnx(_fitted(REGRESSORS["mlp_tanh"], X, y), X)
    a, b = ortflow.trainable_initializers(model)[:2]
    feeds = {"X": X, "label": _off_target(y)}
    ours, terms = _ours(ortflow.add_loss_output(model, penalty={a: {"l1": 0.1, "l2": 0.2}, b: {"l2": 0.3}}), feeds,
                        per_row=True)
    base = _training_build(ortflow.add_loss_output(model), feeds)
    expected = {name: value.copy() for name, value in base.items()}
    for penalty in ({a: {"l1": 0.1}}, {a: {"l2": 0.2}}, {b: {"l2": 0.3}}):
        single = _training_build(ortflow.add_loss_output(model, penalty=penalty), feeds)
        for name in expected:
            expected[name] += single[name] - base[name]
    for name, value in expected.items():  # four sums of the training build's, each within its rounding
        assert_close(ours[name], value, rtol=1e-5, atol=4 * float32_sum_atol(terms[name], len(X)), err_msg=name)


@pytest.mark.training_build
def test_inputs_gradient_and_upstream_gradient(regression_data):
    """Gradient of the prediction (not a scalar) with respect to X, given an upstream gradient input."""
    X, y = regression_data
    X = X[:10]
    model = ortflow.to_onnx(_fitted(REGRESSORS["mlp_tanh"], X, y[:10]), X)
    derivative = ortflow.onnx_derivative(model, weights=[], inputs=True)
    assert [i.name for i in derivative.graph.input] == ["X", "variable_grad"]
    assert [o.name for o in derivative.graph.output] == ["X_grad"]
    upstream = np.linspace(-1, 1, 10, dtype=np.float32).reshape(-1, 1)
    sess = InferenceSession(derivative.SerializeToString(), providers=["CPUExecutionProvider"])
    (ours,) = sess.run(None, {"X": X, "variable_grad": upstream})
    fb = OrtGradientForwardBackward(model, weights_to_train=ortflow.trainable_initializers(model),
                                    input_names_to_train=["X"], device="cpu", gradients="onnxruntime")
    fb.forward([X], training=True)
    theirs = fb.backward([upstream])[0].numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)


@pytest.mark.training_build
def test_skl2onnx_pipeline_with_ml_scaler(regression_data):
    """A graph from skl2onnx: an ai.onnx.ml Scaler before the MLP, shapes onnx cannot fully infer. The weights'
    gradients match the training build's; the input's gradient would cross the Scaler, which has no rule."""
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = regression_data
    X, y = X[:40], y[:40]
    pipeline = _fitted(lambda: make_pipeline(StandardScaler(), REGRESSORS["mlp_tanh"]()), X, y)
    loss = ortflow.add_loss_output(ortflow.to_onnx(pipeline, X))
    _compare(loss, {"X": X, "label": _off_target(y)})
    with pytest.raises(ortflow.NotDifferentiableError, match=r"\(op ai.onnx.ml.Scaler\)"):
        ortflow.onnx_derivative(loss, inputs=True)
