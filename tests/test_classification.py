"""Classification: the log loss for any number of classes, labels as scikit-learn has them, both trainers as
classifiers (iris, digits)."""

import numpy as np
import pytest
from sklearn.base import is_classifier
from sklearn.datasets import load_digits, load_iris, make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

from ortflow import (
    LearningRateAdam,
    NegLogLearningLoss,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
    to_onnx,
)
from ortflow._ort import InferenceSession
from sklearn_fit import quiet_fit


def _split(loader):
    X, y = loader(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.3, random_state=0, stratify=y)
    scaler = StandardScaler().fit(X_train)
    return (scaler.transform(X_train).astype(np.float32), scaler.transform(X_test).astype(np.float32),
            y_train, y_test)


def test_log_loss_of_k_classes_equals_scikit_learns():
    rng = np.random.RandomState(0)
    scores = (rng.randn(50, 4) * 3).astype(np.float32)
    labels = rng.randint(0, 4, 50)
    onehot = np.eye(4, dtype=np.float32)[labels]
    weight = rng.rand(50).astype(np.float32) + 0.1
    proba = np.exp(scores - scores.max(axis=1, keepdims=True))
    proba /= proba.sum(axis=1, keepdims=True)
    loss = NegLogLearningLoss()
    value, grad = loss.loss_gradient("cpu", onehot, scores, weight)
    expected = log_loss(labels, proba, sample_weight=weight, labels=range(4)) * weight.sum() / len(weight)
    assert float(value.numpy()) == pytest.approx(expected, rel=1e-5)
    # the gradient against central finite differences of the same graph, in float64 on the numpy side
    def total(s):
        shifted = s - s.max(axis=1, keepdims=True)
        return float(np.mean(weight * -(onehot * (shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True)))
                                        ).sum(axis=1)))
    numeric = np.zeros_like(scores, dtype=np.float64)
    base = scores.astype(np.float64)
    for i, j in [(0, 0), (3, 2), (17, 1), (49, 3)]:
        step = np.zeros_like(base)
        step[i, j] = 1e-5
        numeric[i, j] = (total(base + step) - total(base - step)) / 2e-5
        assert grad.numpy()[i, j] == pytest.approx(numeric[i, j], rel=1e-3, abs=1e-6)


def test_add_loss_output_log_loss_on_a_multiclass_graph_equals_scikit_learn():
    X_train, X_test, y_train, y_test = _split(load_iris)
    model = quiet_fit(LogisticRegression(max_iter=3), X_train, y_train)
    graph = add_loss_output(to_onnx(model), "log", weight_name="weight")
    weight = np.linspace(0.5, 1.5, len(X_test)).astype(np.float32)
    sess = InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    onehot = np.eye(3, dtype=np.float32)[np.searchsorted(model.classes_, y_test)]
    loss = sess.run(["loss"], {"X": X_test, "label": onehot, "weight": weight})[0]
    expected = log_loss(y_test, model.predict_proba(X_test), sample_weight=weight) * weight.sum() / len(weight)
    assert float(loss) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("cls", [OrtGradientOptimizer, OrtGradientForwardBackwardOptimizer])
@pytest.mark.parametrize("loader,model", [
    (load_iris, LogisticRegression(max_iter=1)),
    (load_iris, MLPClassifier(hidden_layer_sizes=(16,), max_iter=1, random_state=0)),
    (load_digits, MLPClassifier(hidden_layer_sizes=(32,), max_iter=1, random_state=0)),
])
def test_trainers_reach_scikit_learns_accuracy(cls, loader, model):
    """From a one-epoch scikit-learn fit, within 0.02 of scikit-learn's own converged test accuracy."""
    X_train, X_test, y_train, y_test = _split(loader)
    start = quiet_fit(model, X_train, y_train)
    reference = type(model)(**{**model.get_params(), "max_iter": 500}).fit(X_train, y_train).score(X_test, y_test)
    onx = to_onnx(start)
    params = dict(max_iter=60, batch_size=16, learning_rate=LearningRateAdam(eta0=0.01), random_state=0)
    if cls is OrtGradientOptimizer:
        est = cls(add_loss_output(onx, "log"), **params)
    else:
        est = cls(onx, learning_loss="log", **params)
    est.fit(X_train, y_train)
    assert is_classifier(est)
    np.testing.assert_array_equal(est.classes_, start.classes_)
    assert est.score(X_test, y_test) >= reference - 0.02
    proba = est.predict_proba(X_test)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(est.predict(X_test), est.classes_[proba.argmax(axis=1)])


@pytest.mark.parametrize("labels", [(-1, 1), (1, 2), ("no", "yes"), (0, 1)])
@pytest.mark.parametrize("cls", [OrtGradientOptimizer, OrtGradientForwardBackwardOptimizer])
def test_binary_labels_of_any_values(cls, labels):
    """Seen: labels {-1, 1} or {1, 2} trained to a negative loss (-5.94) while accuracy fell to 0.81 / 0.56."""
    X, y01 = make_classification(300, n_features=6, random_state=0)
    X = X.astype(np.float32)
    y = np.array(labels, dtype=object if isinstance(labels[0], str) else np.int64)[y01]
    start = quiet_fit(LogisticRegression(max_iter=1), X, y)
    onx = to_onnx(start)
    params = dict(max_iter=20, learning_rate=0.05, random_state=0)
    est = (cls(add_loss_output(onx, "log"), **params) if cls is OrtGradientOptimizer
           else cls(onx, learning_loss="log", **params)).fit(X, y)
    assert min(est.train_losses_) > 0
    assert est.train_losses_[-1] < est.train_losses_[0]
    assert est.score(X, y) >= start.score(X, y) - 0.01
    assert set(est.predict(X)) <= set(labels)
    np.testing.assert_allclose(est.losses(X, y).mean(), log_loss(y, est.predict_proba(X), labels=start.classes_),
                               rtol=1e-4)


def test_a_label_outside_the_graphs_classes_is_named():
    X, y = make_classification(100, n_features=4, random_state=0)
    X = X.astype(np.float32)
    onx = to_onnx(quiet_fit(LogisticRegression(max_iter=1), X, y))
    y_bad = y.copy()
    y_bad[:3] = 7
    with pytest.raises(ValueError, match=r"labels \[7\] that are not among the classes the graph carries \[0, 1\]"):
        OrtGradientForwardBackwardOptimizer(onx, learning_loss="log", max_iter=1).fit(X, y_bad)
    with pytest.raises(ValueError, match="one label per sample"):
        OrtGradientOptimizer(add_loss_output(onx, "log"), max_iter=1).fit(X, np.c_[y, y])


@pytest.mark.parametrize("cls", [OrtGradientOptimizer, OrtGradientForwardBackwardOptimizer])
def test_scikit_learn_classifier_checks_that_apply(cls):
    """The checks that do not generate data of their own width (a graph has a fixed number of features)."""
    from sklearn.utils.estimator_checks import (
        check_estimators_unfitted,
        check_get_params_invariance,
        check_no_attributes_set_in_init,
        check_parameters_default_constructible,
        check_set_params,
    )

    X, y = make_classification(60, n_features=4, n_classes=3, n_informative=3, n_redundant=0, random_state=0)
    onx = to_onnx(quiet_fit(LogisticRegression(max_iter=1), X.astype(np.float32), y))
    est = cls(add_loss_output(onx, "log") if cls is OrtGradientOptimizer else onx)
    assert is_classifier(est)
    for check in (check_no_attributes_set_in_init, check_get_params_invariance, check_set_params,
                  check_estimators_unfitted, check_parameters_default_constructible):
        check(cls.__name__, est)
