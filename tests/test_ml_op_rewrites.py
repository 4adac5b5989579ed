"""make_trainable: skl2onnx graphs with ai.onnx.ml linear ops become trainable graphs that predict the same."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from skl2onnx import to_onnx as skl_to_onnx
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

from ortflow import (
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    UnsupportedModelError,
    add_loss_output,
    make_trainable,
    trainable_initializers,
)
from ortflow.convert.sklearn import graph_classes
from tolerances import assert_close, matmul_atol

OPSETS = {"": 17, "ai.onnx.ml": 3}


def _run(onx, X):
    sess = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"X": X})))


def _ml_ops(onx):
    return [n.op_type for n in onx.graph.node if n.domain == "ai.onnx.ml"]


@pytest.fixture(scope="module")
def iris():
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    return X.astype(np.float32), y


@pytest.mark.parametrize("targets", [1, 2])
def test_linear_regressor_becomes_matmul_add(regression_data, targets):
    X, y = regression_data
    target = y if targets == 1 else np.c_[y, -2 * y + 1]
    model = LinearRegression().fit(X, target)
    onx = make_trainable(skl_to_onnx(model, X[:1], target_opset=OPSETS))
    assert _ml_ops(onx) == []
    assert trainable_initializers(onx) == ["coef", "intercept"]
    pred = _run(onx, X)["variable"]
    np.testing.assert_allclose(pred.reshape(model.predict(X).shape), model.predict(X), rtol=1e-4, atol=1e-4)
    assert graph_classes(onx) is None


@pytest.mark.parametrize("labels", ["binary", "three", "strings"])
@pytest.mark.parametrize("zipmap", [True, False])
def test_linear_classifier_gets_the_classifier_contract(iris, labels, zipmap):
    X, y = iris
    target = {"binary": (y > 0).astype(np.int64), "three": y, "strings": np.array(["a", "b", "c"])[y]}[labels]
    model = LogisticRegression(max_iter=500).fit(X, target)
    options = {} if zipmap else {"options": {id(model): {"zipmap": False}}}
    original = skl_to_onnx(model, X[:1], target_opset=OPSETS, **options)
    assert "LinearClassifier" in _ml_ops(original)
    onx = make_trainable(original)
    assert _ml_ops(onx) == []
    assert [o.name for o in onx.graph.output] == ["output_label", "output_probability", "raw_score"]
    assert trainable_initializers(onx) == ["coef", "intercept"]
    out = _run(onx, X)
    np.testing.assert_array_equal(out["output_label"], model.predict(X))
    np.testing.assert_allclose(out["output_probability"], model.predict_proba(X), atol=1e-5)
    assert out["raw_score"].shape == (len(X), 1 if labels == "binary" else 3)
    np.testing.assert_array_equal(graph_classes(onx), model.classes_)


def test_scaler_in_front_is_kept_and_full_training_runs(iris):
    X, y = iris
    target = (y > 0).astype(np.int64)
    pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=3)).fit(X, target)
    onx = make_trainable(skl_to_onnx(pipe, X[:1], target_opset=OPSETS))
    assert _ml_ops(onx) == ["Scaler"]
    np.testing.assert_allclose(_run(onx, X)["output_probability"], pipe.predict_proba(X), atol=1e-5)
    trainer = OrtGradientOptimizer(add_loss_output(onx, "log"), max_iter=5, learning_rate=0.1, random_state=0)
    trainer.fit(X, target.astype(np.float32))
    assert list(trainer.get_state()) == ["coef", "intercept"]
    assert trainer.train_losses_[-1] < trainer.train_losses_[0]


def _linear_classifier(coefficients, intercepts, post_transform):
    """A LinearClassifier on 3 features; as many classes (3, 7, 9...) as intercepts, at least two."""
    labels = [3, 7, 9][: max(2, len(intercepts))]
    node = helper.make_node("LinearClassifier", ["X"], ["label", "proba"], domain="ai.onnx.ml", name="lc",
                            coefficients=coefficients, intercepts=intercepts, classlabels_ints=labels,
                            post_transform=post_transform)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
                              [helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
                               helper.make_tensor_value_info("proba", TensorProto.FLOAT, [None, len(labels)])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)],
                             ir_version=8)


def test_binary_softmax_rows_match_onnxruntime_s_own_op():
    """Two independent rows with SOFTMAX (as other converters write binary models): raw_score is their difference."""
    X = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    original = _linear_classifier([0.5, -1.0, 2.0, 0.1, 0.2, -0.3], [0.25, -0.5], "SOFTMAX")
    expected = _run(original, X)
    out = _run(make_trainable(original), X)
    np.testing.assert_array_equal(out["output_label"], expected["label"])
    np.testing.assert_allclose(out["output_probability"], expected["proba"], atol=1e-6)
    w = np.array([-0.4, 1.2, -2.3, -0.75])
    with_ones = np.hstack([X, np.ones((len(X), 1))])
    assert_close(out["raw_score"][:, 0], with_ones @ w, atol=matmul_atol(with_ones, w[:, None])[:, 0])


@pytest.mark.parametrize("coefficients, intercepts, transform, match", [
    ([0.5, -1.0, 2.0], [0.25], "LOGISTIC", "one coefficient row"),
    ([0.5, -1.0, 2.0, 0.1, 0.2, -0.3], [0.25, -0.5], "LOGISTIC", "not opposite"),
    ([0.5, -1.0, 2.0, 0.1, 0.2, -0.3], [0.25, -0.5], "NONE", "raw decision scores"),
    ([0.5, -1.0, 2.0, 0.1, 0.2, -0.3, 1.0, 1.0, 1.0], [0.25, -0.5, 0.0], "LOGISTIC", "one-vs-rest"),
])
def test_layouts_without_a_sigmoid_or_softmax_reading_are_refused(coefficients, intercepts, transform, match):
    with pytest.raises(UnsupportedModelError, match=match):
        make_trainable(_linear_classifier(coefficients, intercepts, transform))


def test_graph_without_ml_ops_is_returned_as_is(regression_data):
    from ortflow import to_onnx

    X, y = regression_data
    onx = to_onnx(LinearRegression().fit(X, y))
    assert make_trainable(onx) is onx


@pytest.mark.parametrize("model, op", [(DecisionTreeRegressor(max_depth=2), "TreeEnsembleRegressor"),
                                       (DecisionTreeClassifier(max_depth=2), "TreeEnsembleClassifier")])
def test_tree_ensemble_is_refused_naming_op_node_and_remedy(iris, model, op):
    X, y = iris
    onx = skl_to_onnx(model.fit(X, y), X[:1], target_opset=OPSETS)
    node = next(n.name for n in onx.graph.node if n.op_type == op)
    with pytest.raises(UnsupportedModelError, match=rf"node '{node}' \(op ai.onnx.ml.{op}\).*linear model or an MLP"):
        make_trainable(onx)
    # naming the weights to train leaves the node alone
    assert make_trainable(onx, weights_to_train=[]) is onx


def test_classifier_output_used_inside_the_graph_is_refused(iris):
    X, y = iris
    onx = skl_to_onnx(LogisticRegression(max_iter=500).fit(X, y), X[:1], target_opset=OPSETS,
                      options={"zipmap": False})
    onx.graph.node.append(helper.make_node("Log", ["probabilities"], ["log_proba"], name="use_proba"))
    onx.graph.output.append(helper.make_tensor_value_info("log_proba", TensorProto.FLOAT, [None, 3]))
    onnx.checker.check_model(onx)
    with pytest.raises(UnsupportedModelError, match=r"feeds 'use_proba' \(Log\)"):
        make_trainable(onx)


def test_several_linear_regressors_get_numbered_weights(regression_data):
    from sklearn.ensemble import VotingRegressor
    from sklearn.linear_model import Ridge

    X, y = regression_data
    model = VotingRegressor([("ls", LinearRegression()), ("ridge", Ridge(alpha=10.0))]).fit(X, y)
    onx = make_trainable(skl_to_onnx(model, X[:1], target_opset=OPSETS))
    assert _ml_ops(onx) == []
    assert {"coef_0", "intercept_0", "coef_1", "intercept_1"} <= set(trainable_initializers(onx))
    np.testing.assert_allclose(_run(onx, X)["variable"].ravel(), model.predict(X), rtol=1e-4, atol=1e-4)


def test_normalizer_that_changes_probabilities_is_refused(iris):
    X, y = iris
    onx = skl_to_onnx(LogisticRegression(max_iter=500).fit(X, y), X[:1], target_opset=OPSETS)
    normalizer = next(n for n in onx.graph.node if n.op_type == "Normalizer")
    next(a for a in normalizer.attribute if a.name == "norm").s = b"MAX"
    with pytest.raises(UnsupportedModelError, match="norm='MAX'; only L1"):
        make_trainable(onx)


def test_own_gradient_graphs_train_a_pipeline_with_an_ml_scaler(regression_data):
    """ortflow's own forward-backward graphs on a StandardScaler + LinearRegression pipeline: onnx cannot infer the
    type of what the ai.onnx.ml Scaler writes, and the backward graph's saved inputs were left untyped
    (KeyError 'grad_reshape_5' on the plain build)."""
    from ortflow import OrtGradientForwardBackwardOptimizer, to_onnx

    X, y = regression_data
    pipeline = make_pipeline(StandardScaler(), LinearRegression()).fit(X[:20], np.zeros(20))
    trainer = OrtGradientForwardBackwardOptimizer(to_onnx(pipeline, X[:5]), max_iter=5, batch_size=20,
                                                  learning_rate=0.05, gradients="ortflow").fit(X, y)
    assert trainer.gradients_ == "ortflow"
    assert trainer.train_losses_[-1] < 0.1 * trainer.train_losses_[0]


def _trainer(cls, onx, task):
    """``cls`` on ``onx`` as a user writes it: the full trainer on the graph with its loss added."""
    params = dict(max_iter=3, random_state=0, learning_rate=0.01)
    if cls is OrtGradientOptimizer:
        return cls(add_loss_output(onx, score_name="log" if task == "classifier" else "squared_error"), **params)
    return cls(onx, learning_loss="log" if task == "classifier" else "squared_error", **params)


@pytest.mark.parametrize("cls", [OrtGradientOptimizer, OrtGradientForwardBackwardOptimizer])
@pytest.mark.parametrize("task", ["regressor", "classifier"])
def test_a_raw_skl2onnx_graph_given_to_a_trainer_is_made_trainable(classification_data, regression_data, cls, task):
    """Seen: ``OrtGradientForwardBackwardOptimizer(skl2onnx_graph)`` with a LinearRegressor failed with "the graph
    has no float initializer to train" (a LinearClassifier: "the graph has 2 outputs"; add_loss_output the same)."""
    if task == "regressor":
        X, y = regression_data
        model = LinearRegression().fit(X, y)
    else:
        X, y = classification_data
        model = LogisticRegression().fit(X, y)
    raw = skl_to_onnx(model, X[:1], target_opset=OPSETS)  # ZipMap kept, as skl2onnx writes it by default
    assert _ml_ops(raw)[0] == {"regressor": "LinearRegressor", "classifier": "LinearClassifier"}[task]
    given = raw.SerializeToString()
    auto = _trainer(cls, raw, task).fit(X, y)
    explicit = _trainer(cls, make_trainable(raw), task).fit(X, y)
    assert raw.SerializeToString() == given  # model_onnx is left as given
    assert _ml_ops(auto.get_trained_onnx()) == []
    state = auto.get_state()
    assert {"coef", "intercept"} <= set(state)
    assert np.abs(state["coef"].ravel() - model.coef_.ravel()).max() > 0  # it trained the weights
    for name, value in explicit.get_state().items():  # the very training of the rewritten graph
        np.testing.assert_array_equal(state[name], value, err_msg=name)
    np.testing.assert_array_equal(auto.predict(X), explicit.predict(X))
