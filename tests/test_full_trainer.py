"""OrtGradientOptimizer: full training inside onnxruntime, against scikit-learn and numpy references."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from sklearn.base import clone
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.model_selection import GridSearchCV
from sklearn.neural_network import MLPClassifier, MLPRegressor

from ortflow import LearningRateAdam, LearningRateAdamW, OrtGradientOptimizer, add_loss_output, to_onnx


@pytest.fixture(scope="module")
def poor_linear(regression_data):
    """A linear graph whose weights start far from the solution (fitted on zeros)."""
    X, _ = regression_data
    return add_loss_output(to_onnx(LinearRegression().fit(X[:20], np.zeros(20))))


def test_linear_regression_reaches_sklearn_coefficients(regression_data, poor_linear):
    X, y = regression_data
    ref = LinearRegression().fit(X, y)
    est = OrtGradientOptimizer(poor_linear, max_iter=60, batch_size=10, learning_rate=0.02, random_state=0)
    est.fit(X, y)
    state = est.get_state()
    # SGD with a constant rate ends within noise of the least-squares solution: 2e-2 absolute on coefficients
    # of magnitude ~1 (y was divided by 50).
    np.testing.assert_allclose(state["coef"].ravel(), ref.coef_, atol=2e-2)
    np.testing.assert_allclose(state["intercept"], [ref.intercept_], atol=2e-2)
    assert est.train_losses_[-1] < est.train_losses_[0] / 50
    assert est.score(X, y) > 0.99


def test_mlp_loss_falls_steadily(regression_data):
    X, y = regression_data
    mlp = MLPRegressor(hidden_layer_sizes=(16, 8), max_iter=1, random_state=0).fit(X, y)
    est = OrtGradientOptimizer(add_loss_output(to_onnx(mlp)), max_iter=30, batch_size=16, learning_rate=0.005,
                               random_state=0).fit(X, y)
    losses = np.array(est.train_losses_)
    assert len(losses) == 30 and est.n_iter_ == 30
    # steady: every 5-epoch window ends lower than the previous one
    windows = losses.reshape(6, 5).mean(axis=1)
    assert (np.diff(windows) < 0).all(), windows
    assert losses[-1] < losses[0] / 5


def test_invscaling_schedule_follows_sklearn_formula(regression_data, poor_linear):
    X, y = regression_data
    est = OrtGradientOptimizer(poor_linear, max_iter=3, learning_rate=0.05, lr_schedule="invscaling",
                               power_t=0.5, shuffle=False).fit(X, y)
    rates = [r["learning_rate"] for r in est.history_]
    np.testing.assert_allclose(rates, [0.05 / (k * len(X) + 1) ** 0.5 for k in range(3)])


@pytest.mark.parametrize("rate", [LearningRateAdam(eta0=0.05), LearningRateAdamW(eta0=0.05, weight_decay=0.01)])
def test_adam_type_optimizers_train(regression_data, poor_linear, rate):
    X, y = regression_data
    est = OrtGradientOptimizer(poor_linear, max_iter=15, learning_rate=rate, random_state=0).fit(X, y)
    assert est.train_losses_[-1] < est.train_losses_[0] / 10


def test_sample_weight_changes_the_fit(regression_data):
    X, y = regression_data
    graph = add_loss_output(to_onnx(LinearRegression().fit(X, y)), weight_name="weight")
    weight = np.where(np.arange(len(X)) < 200, 1.0, 0.0)
    y2 = y.copy()
    y2[200:] += 100  # ignored rows: a zero weight must make them irrelevant
    est = OrtGradientOptimizer(graph, max_iter=5, learning_rate=0.01, random_state=0).fit(X, y2, sample_weight=weight)
    assert est.score(X[:200], y[:200]) > 0.99


def test_validation_and_early_stopping(regression_data, poor_linear):
    X, y = regression_data
    est = OrtGradientOptimizer(poor_linear, max_iter=200, learning_rate=0.02, validation_fraction=0.2,
                               early_stopping=True, n_iter_no_change=3, tol=1e-3, random_state=0).fit(X, y)
    assert est.n_iter_ < 200
    assert len(est.validation_losses_) == est.n_iter_
    assert est.validation_losses_[-1] < est.validation_losses_[0]


def test_binary_classifier_trained_with_log_loss_exports_labels_and_probabilities(classification_data):
    X, y = classification_data
    start = LogisticRegression(max_iter=1).fit(X[:30], y[:30])
    graph = add_loss_output(to_onnx(start), "log")
    est = OrtGradientOptimizer(graph, max_iter=20, learning_rate=0.05, random_state=0).fit(X, y)
    assert est.train_losses_[-1] < est.train_losses_[0]
    ref = LogisticRegression().fit(X, y).score(X, y)
    assert est.score(X, y) >= ref - 0.03
    sess = ort.InferenceSession(est.get_trained_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    label, proba, _ = sess.run(None, {"X": X})
    np.testing.assert_array_equal(label, est.predict(X))
    np.testing.assert_allclose(proba.sum(axis=1), 1, atol=1e-6)
    np.testing.assert_allclose(est.predict_proba(X), proba)
    assert set(np.unique(label)) <= {0, 1}


def test_mlp_classifier_raw_scores_train(classification_data):
    X, y = classification_data
    mlp = MLPClassifier(hidden_layer_sizes=(8,), max_iter=1, random_state=0).fit(X, y)
    est = OrtGradientOptimizer(add_loss_output(to_onnx(mlp), "log"), max_iter=20, learning_rate=0.05,
                               random_state=0).fit(X, y)
    assert est.score(X, y) > 0.85


@pytest.mark.parametrize("gradients,graphs", [
    ("ortflow", {"training_step"}),
    pytest.param("onnxruntime", {"training_model", "eval_model", "optimizer_model"}, marks=pytest.mark.training_build),
])
def test_save_onnx_graph_writes_every_graph_and_they_load(tmp_path, regression_data, poor_linear, gradients, graphs):
    X, y = regression_data
    est = OrtGradientOptimizer(poor_linear, max_iter=2, gradients=gradients).fit(X, y)
    assert est.gradients_ == gradients
    paths = est.save_onnx_graph(tmp_path / "graphs")
    assert set(paths) == {"loss_model", "trained_model"} | graphs
    for path in paths.values():
        assert os.path.getsize(path) > 0
        onnx.load(path)
    trained = ort.InferenceSession(paths["trained_model"], providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(trained.run(None, {"X": X})[0].ravel(), est.predict(X), rtol=1e-6)
    assert [i.name for i in onnx.load(paths["trained_model"]).graph.input] == ["X"]


def test_set_state_round_trip_and_warm_start(regression_data, poor_linear):
    X, y = regression_data
    est = OrtGradientOptimizer(poor_linear, max_iter=3, warm_start=True, random_state=0).fit(X, y)
    state = est.get_state()
    est.fit(X, y)
    assert est.n_iter_ == 6  # warm start continues
    est.set_state(state)
    np.testing.assert_array_equal(est.get_state()["coef"], state["coef"])
    with pytest.raises(KeyError, match="not trained weights"):
        est.set_state({"nope": np.zeros(1)})


def test_grid_search_and_clone(regression_data, poor_linear):
    X, y = regression_data
    est = OrtGradientOptimizer(poor_linear, max_iter=5, random_state=0)
    assert clone(est).get_params()["learning_rate"] == 0.01
    search = GridSearchCV(est, {"learning_rate": [1e-4, 2e-2]}, cv=2).fit(X, y)
    assert search.best_params_ == {"learning_rate": 2e-2}
    assert search.best_estimator_.score(X, y) > 0.9


def test_frozen_weights_do_not_move(regression_data, poor_linear):
    X, y = regression_data
    est = OrtGradientOptimizer(poor_linear, weights_to_train=["coef"], max_iter=3).fit(X, y)
    assert list(est.get_state()) == ["coef"]
    trained = {i.name: i for i in est.get_trained_onnx().graph.initializer}
    original = {i.name: i for i in poor_linear.graph.initializer}
    assert trained["intercept"] == original["intercept"]


def test_pickle_keeps_predictions(regression_data, poor_linear):
    import pickle

    X, y = regression_data
    est = OrtGradientOptimizer(poor_linear, max_iter=2).fit(X, y)
    copy = pickle.loads(pickle.dumps(est))
    np.testing.assert_allclose(copy.predict(X), est.predict(X))


def test_sklearn_estimator_checks_that_apply(poor_linear):
    from sklearn.utils.estimator_checks import (
        check_get_params_invariance,
        check_no_attributes_set_in_init,
        check_set_params,
    )

    est = OrtGradientOptimizer(poor_linear)
    check_no_attributes_set_in_init("OrtGradientOptimizer", est)
    check_get_params_invariance("OrtGradientOptimizer", est)
    check_set_params("OrtGradientOptimizer", est)


def test_device_auto_runs_on_what_is_available(regression_data, poor_linear):
    X, y = regression_data
    est = OrtGradientOptimizer(poor_linear, max_iter=2, device="auto").fit(X, y)
    assert np.isfinite(est.train_losses_).all()


@pytest.mark.gpu
def test_cuda_training_matches_cpu(regression_data, poor_linear):
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("needs the CUDA build of onnxruntime-training and a GPU")
    X, y = regression_data
    params = dict(max_iter=3, shuffle=False, learning_rate=0.01)
    cpu = OrtGradientOptimizer(poor_linear, device="cpu", **params).fit(X, y)
    gpu = OrtGradientOptimizer(poor_linear, device="cuda", **params).fit(X, y)
    np.testing.assert_allclose(gpu.get_state()["coef"], cpu.get_state()["coef"], rtol=1e-4, atol=1e-5)
