"""to_onnx: converted graphs predict like scikit-learn (labels, probabilities, classes) and expose trainable
weights under the documented names."""

import numpy as np
import onnxruntime as ort
import pytest
from sklearn.linear_model import (
    ElasticNet,
    Lasso,
    LinearRegression,
    LogisticRegression,
    Ridge,
    SGDClassifier,
    SGDRegressor,
)
from sklearn.neural_network import MLPClassifier, MLPRegressor

from ortflow import UnsupportedModelError, to_onnx, trainable_initializers
from ortflow.convert.sklearn import graph_classes
from sklearn_fit import quiet_fit


def _session(onx):
    return ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])


SINGLE = ["coef", "intercept"]


@pytest.mark.parametrize(
    "model, weights",
    [
        (LinearRegression(), SINGLE),
        (Ridge(alpha=0.5), SINGLE),
        (Lasso(alpha=0.01), SINGLE),
        (ElasticNet(alpha=0.01), SINGLE),
        (SGDRegressor(max_iter=50, random_state=0), SINGLE),
        (MLPRegressor(hidden_layer_sizes=(6, 4), max_iter=30, random_state=0),
         ["coef_0", "intercept_0", "coef_1", "intercept_1", "coef_2", "intercept_2"]),
        (MLPRegressor(hidden_layer_sizes=(5,), activation="tanh", max_iter=30, random_state=0),
         ["coef_0", "intercept_0", "coef_1", "intercept_1"]),
    ],
)
def test_regressors_match_sklearn(regression_data, model, weights):
    """Single-layer models name their weights ``coef``/``intercept`` (the seed documents' names), MLPs per layer."""
    X, y = regression_data
    model.fit(X, y)
    onx = to_onnx(model)
    pred = _session(onx).run(None, {"X": X})[0]
    np.testing.assert_allclose(pred.ravel(), model.predict(X), rtol=1e-3, atol=1e-3)
    assert {n.op_type for n in onx.graph.node} <= {"MatMul", "Add", "Relu", "Tanh"}
    assert trainable_initializers(onx) == weights


def _check_classifier(model, X):
    """Before training the graph predicts what scikit-learn predicts: labels, probabilities, classes."""
    onx = to_onnx(model)
    label, proba, raw = _session(onx).run(None, {"X": X})
    k = len(model.classes_)
    assert [o.name for o in onx.graph.output] == ["output_label", "output_probability", "raw_score"]
    np.testing.assert_array_equal(label, model.predict(X))
    np.testing.assert_allclose(proba, model.predict_proba(X), atol=1e-5)
    assert proba.dtype == raw.dtype == np.float32
    assert raw.shape == (len(X), 1 if k == 2 else k)
    np.testing.assert_array_equal(graph_classes(onx), model.classes_)
    assert "classes" not in trainable_initializers(onx)
    return onx, label, proba, raw


@pytest.mark.parametrize(
    "model",
    [LogisticRegression(), MLPClassifier(hidden_layer_sizes=(6,), max_iter=30, random_state=0)],
)
def test_binary_classifiers_give_labels_probabilities_and_raw_score(classification_data, model):
    X, y = classification_data
    quiet_fit(model, X, y)
    onx, label, proba, raw = _check_classifier(model, X)
    np.testing.assert_allclose(proba[:, 1], 1 / (1 + np.exp(-raw[:, 0].astype(np.float64))), atol=1e-6)
    assert label.dtype == np.int64
    assert trainable_initializers(onx)[:2] == (["coef", "intercept"] if isinstance(model, LogisticRegression)
                                               else ["coef_0", "intercept_0"])


@pytest.fixture(scope="module")
def iris():
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    return X.astype(np.float32), y


IRIS_MODELS = [
    LogisticRegression(max_iter=500),
    MLPClassifier(hidden_layer_sizes=(8,), activation="relu", max_iter=200, random_state=0),
    MLPClassifier(hidden_layer_sizes=(8, 5), activation="tanh", max_iter=200, random_state=0),
    MLPClassifier(hidden_layer_sizes=(8,), activation="logistic", max_iter=200, random_state=0),
]


@pytest.mark.parametrize("model", IRIS_MODELS, ids=lambda m: f"{type(m).__name__}-{getattr(m, 'activation', '')}")
def test_multiclass_on_iris_matches_sklearn(iris, model):
    X, y = iris
    quiet_fit(model, X, y)
    _, _, proba, raw = _check_classifier(model, X)
    # the probabilities are the softmax of the raw scores
    z = raw.astype(np.float64) - raw.max(axis=1, keepdims=True)
    np.testing.assert_allclose(proba, np.exp(z) / np.exp(z).sum(axis=1, keepdims=True), atol=1e-6)


def test_mlp_on_digits_matches_sklearn():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = (X / 16).astype(np.float32)
    model = quiet_fit(MLPClassifier(hidden_layer_sizes=(32,), max_iter=30, random_state=0), X, y)
    _check_classifier(model, X)


@pytest.mark.parametrize("classes", [[-1, 1], [1, 2], ["no", "yes"]], ids=str)
@pytest.mark.parametrize("kind", ["logistic", "mlp"])
def test_binary_labels_of_any_value(classification_data, classes, kind):
    """Labels come back as scikit-learn has them, through the ``classes`` initializer, whatever their values."""
    X, y01 = classification_data
    y = np.asarray(classes)[y01]
    model = LogisticRegression() if kind == "logistic" else MLPClassifier((6,), max_iter=200, random_state=0)
    quiet_fit(model, X, y)
    _, label, _, _ = _check_classifier(model, X)
    assert set(label) == set(classes)


def test_integral_float_classes_become_int64(iris):
    X, y = iris
    model = LogisticRegression(max_iter=500).fit(X, y.astype(np.float64))
    _, label, _, _ = _check_classifier(model, X)
    assert label.dtype == np.int64


def test_graph_classes_of_a_regressor_is_none(regression_data):
    X, y = regression_data
    assert graph_classes(to_onnx(LinearRegression().fit(X, y))) is None


def test_one_vs_rest_and_multilabel_are_refused_with_reason(iris):
    X, y = iris
    with pytest.raises(UnsupportedModelError, match="SGDClassifier with 3 classes scores each class one-vs-rest"):
        to_onnx(SGDClassifier(loss="log_loss", max_iter=5, tol=None, random_state=0).fit(X, y))
    indicator = np.eye(3, dtype=np.int64)[y]
    multilabel = quiet_fit(MLPClassifier((4,), max_iter=5, random_state=0), X, indicator)
    with pytest.raises(UnsupportedModelError, match="multilabel"):
        to_onnx(multilabel)


def test_other_models_go_through_skl2onnx(regression_data):
    from sklearn.preprocessing import StandardScaler

    X, _ = regression_data
    scaler = StandardScaler().fit(X)
    onx = to_onnx(scaler, X)
    assert onx.ir_version <= 10
    np.testing.assert_allclose(_session(onx).run(None, {"X": X})[0], scaler.transform(X), atol=1e-5)


def test_binary_ridge_classifier_with_a_one_dimensional_coef_trains_and_predicts(classification_data):
    """A binary RidgeClassifier keeps ``coef_`` 1-D: converted as one score column, its graph predicts its labels
    before and after training (it was accepted, then failed in onnxruntime: "Concat head_scores: axis 1")."""
    from sklearn.linear_model import RidgeClassifier

    from ortflow import OrtGradientForwardBackwardOptimizer

    X, y = classification_data
    model = RidgeClassifier().fit(X, y)
    assert np.ndim(model.coef_) == 1
    onx = to_onnx(model)
    label, raw = (_session(onx).run(None, {"X": X})[i] for i in (0, 2))
    np.testing.assert_array_equal(label, model.predict(X))
    assert raw.shape == (len(X), 1)
    trainer = OrtGradientForwardBackwardOptimizer(onx, learning_loss="log", max_iter=3, batch_size=50).fit(X, y)
    assert trainer.train_losses_[-1] < trainer.train_losses_[0]
    assert (trainer.predict(X) == y).mean() > 0.8
