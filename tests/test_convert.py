"""to_onnx: converted graphs predict like scikit-learn and expose trainable weights."""

import numpy as np
import onnxruntime as ort
import pytest
from sklearn.linear_model import ElasticNet, Lasso, LinearRegression, LogisticRegression, Ridge, SGDRegressor
from sklearn.neural_network import MLPClassifier, MLPRegressor

from ortflow import to_onnx, trainable_initializers


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


@pytest.mark.parametrize(
    "model",
    [LogisticRegression(), MLPClassifier(hidden_layer_sizes=(6,), max_iter=30, random_state=0)],
)
def test_binary_classifiers_give_labels_probabilities_and_raw_score(classification_data, model):
    X, y = classification_data
    model.fit(X, y)
    label, proba, raw = _session(to_onnx(model)).run(None, {"X": X})
    np.testing.assert_array_equal(label, model.predict(X))
    np.testing.assert_allclose(proba, model.predict_proba(X), atol=1e-5)
    assert raw.shape == (len(X), 1)


def test_multiclass_is_refused_with_reason(classification_data):
    X, _ = classification_data
    y = np.arange(len(X)) % 3
    with pytest.raises(ValueError, match="3 classes"):
        to_onnx(LogisticRegression(max_iter=200).fit(X, y))


def test_other_models_go_through_skl2onnx(regression_data):
    from sklearn.preprocessing import StandardScaler

    X, _ = regression_data
    scaler = StandardScaler().fit(X)
    onx = to_onnx(scaler, X)
    assert onx.ir_version <= 10
    np.testing.assert_allclose(_session(onx).run(None, {"X": X})[0], scaler.transform(X), atol=1e-5)
