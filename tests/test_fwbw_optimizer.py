"""OrtGradientForwardBackwardOptimizer against full training, scikit-learn and numpy."""

import pickle
import warnings

import numpy as np
import onnxruntime as ort
import pytest
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression
from sklearn.model_selection import GridSearchCV
from sklearn.neural_network import MLPClassifier, MLPRegressor

from ortflow._ort import TRAINING
from ortflow import Checkpoint, ConvergenceError, NotDifferentiableError, OrtGradientOptimizer, add_loss_output, to_onnx
from ortflow import (AbsoluteLearningLoss, ElasticLearningLoss, ElasticLearningPenalty, LearningRateAdam,
                     LearningRateSGD, LearningRateSGDNesterov, NegLogLearningLoss, OrtGradientForwardBackwardOptimizer)


def _constant(eta0):
    return LearningRateSGD(eta0=eta0, learning_rate="constant")


@pytest.fixture(scope="module")
def linear_start(regression_data):
    """A linear graph fitted on zeros: its weights start far from the solution."""
    X, _ = regression_data
    return to_onnx(LinearRegression().fit(X[:20], np.zeros(20)))


@pytest.fixture(scope="module")
def mlp_start(regression_data):
    X, y = regression_data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return to_onnx(MLPRegressor(hidden_layer_sizes=(8,), max_iter=1, random_state=0).fit(X, y))


@pytest.mark.parametrize(
    "fwbw_loss,score,kwargs",
    [("square_error", "squared_error", {}), (AbsoluteLearningLoss(), "absolute_error", {}),
     (ElasticLearningLoss(0.3, 0.6), "elastic", {"l1_weight": 0.3, "l2_weight": 0.6})],
)
def test_same_weights_as_full_training(regression_data, linear_start, fwbw_loss, score, kwargs):
    X, y = regression_data
    common = dict(max_iter=4, batch_size=10, shuffle=False)
    full = OrtGradientOptimizer(add_loss_output(linear_start, score, **kwargs), learning_rate=0.02,
                                lr_schedule="constant", **common).fit(X, y)
    fwbw = OrtGradientForwardBackwardOptimizer(linear_start, learning_rate=_constant(0.02), learning_loss=fwbw_loss,
                                               **common).fit(X, y)
    for name, value in full.get_state().items():
        np.testing.assert_allclose(fwbw.get_state()[name], value, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fwbw.train_losses_, full.train_losses_, rtol=1e-4)


def test_large_batches_keep_their_buffers_alive(regression_data, linear_start):
    """Batches of 300 rows (buffers past numpy's small-block cache): the bound buffers must outlive the epoch."""
    X, y = regression_data
    common = dict(max_iter=3, batch_size=300, shuffle=False)
    full = OrtGradientOptimizer(add_loss_output(linear_start), learning_rate=0.02, **common).fit(X, y)
    fwbw = OrtGradientForwardBackwardOptimizer(linear_start, learning_rate=_constant(0.02), **common).fit(X, y)
    np.testing.assert_allclose(fwbw.train_losses_, full.train_losses_, rtol=1e-5)
    np.testing.assert_allclose(fwbw.get_state()["coef"], full.get_state()["coef"], rtol=1e-5, atol=1e-6)


def test_same_weights_as_full_training_with_penalty_mlp_and_validation(regression_data, mlp_start):
    X, y = regression_data
    common = dict(max_iter=3, batch_size=16, shuffle=False, validation_fraction=0.25, random_state=1)
    # one penalty term: add_loss_output joins several terms with Sum, which has no gradient in onnxruntime 1.19
    penalty = {"coef_0": {"l2": 1e-2}}
    full = OrtGradientOptimizer(add_loss_output(mlp_start, penalty=penalty), learning_rate=0.01, **common).fit(X, y)
    fwbw = OrtGradientForwardBackwardOptimizer(
        mlp_start, learning_rate=_constant(0.01),
        learning_penalty=ElasticLearningPenalty(0.0, 1e-2, weights=["coef_0"]), n_threads=2,
        gradients="onnxruntime" if TRAINING else "ortflow", **common).fit(X, y)  # its static graphs, below
    for name, value in full.get_state().items():
        np.testing.assert_allclose(fwbw.get_state()[name], value, rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(fwbw.train_losses_, full.train_losses_, rtol=1e-4)
    np.testing.assert_allclose(fwbw.validation_losses_, full.validation_losses_, rtol=1e-4)
    if fwbw.gradients_ == "ortflow":  # one graph for any batch size
        return
    # 300 training rows: batches of 16 and a last one of 12, each trained by a graph built for its shape
    assert sorted(fwbw._rt_runtime.fb._static) == [((12, 8),), ((16, 8),)]
    assert not hasattr(fwbw._rt_runtime.fb, "static_failures_")
    # sessions: shape-agnostic, batch of 16 (the trainer's threads), last batch of 12 (one thread)
    threads = [sess.get_session_options().intra_op_num_threads for sess in fwbw._rt_runtime.fb._sessions]
    assert len(threads) == 3 and threads[2] == 1 and threads[1] == threads[0] == 2


def test_mlp_classifier_with_neg_log_loss_close_to_sklearn(classification_data):
    X, y = classification_data
    schedule = dict(hidden_layer_sizes=(10,), solver="sgd", learning_rate="invscaling", learning_rate_init=0.05,
                    power_t=0.25, momentum=0.9, nesterovs_momentum=True, batch_size=16, alpha=0.0, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        reference = MLPClassifier(max_iter=25, **schedule).fit(X, y)
        start = MLPClassifier(max_iter=1, **schedule).fit(X[:50], y[:50])
    rate = LearningRateSGDNesterov(eta0=0.05, power_t=0.25, learning_rate="invscaling", momentum=0.9)
    est = OrtGradientForwardBackwardOptimizer(to_onnx(start), max_iter=25, batch_size=16, learning_rate=rate,
                                              learning_loss=NegLogLearningLoss(), random_state=0).fit(X, y)
    assert est.train_losses_[-1] < 0.7 * est.train_losses_[0]
    assert est.score(X, y) >= reference.score(X, y) - 0.03, (est.score(X, y), reference.score(X, y))
    sess = ort.InferenceSession(est.get_trained_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    label, proba, raw = sess.run(None, {"X": X})
    np.testing.assert_array_equal(label, est.predict(X))
    np.testing.assert_allclose(proba.sum(axis=1), 1, atol=1e-6)
    np.testing.assert_allclose(proba[:, 1], 1 / (1 + np.exp(-raw[:, 0].astype(np.float64))), atol=1e-6)
    assert set(np.unique(label)) <= {0, 1}


def test_elastic_penalty_shrinks_the_weights(regression_data, mlp_start):
    X, y = regression_data
    common = dict(max_iter=8, batch_size=16, learning_rate=_constant(0.01), random_state=0)
    free = OrtGradientForwardBackwardOptimizer(mlp_start, **common).fit(X, y)
    penalty = ElasticLearningPenalty(0.01, 0.05, weights=["coef_0", "coef_1"])
    shrunk = OrtGradientForwardBackwardOptimizer(mlp_start, learning_penalty=penalty, **common).fit(X, y)
    norms = [sum(np.abs(est.get_state()[n]).sum() for n in ("coef_0", "coef_1")) for est in (free, shrunk)]
    assert norms[1] < 0.9 * norms[0], norms
    # the reported loss includes the penalty: larger than the data loss alone
    data_loss = np.mean((shrunk.predict(X) - y) ** 2)
    assert shrunk.train_losses_[-1] > data_loss


def test_adam_trains(regression_data, mlp_start):
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(mlp_start, max_iter=10, batch_size=16,
                                              learning_rate=LearningRateAdam(eta0=0.01), random_state=0).fit(X, y)
    assert est.train_losses_[-1] < est.train_losses_[0] / 3
    assert int(est.get_optimizer_state()["step"]) == 10 * 25


def test_grid_search_over_nested_and_named_parameters(regression_data, linear_start):
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(linear_start, max_iter=5, learning_rate=_constant(1e-4), random_state=0)
    search = GridSearchCV(est, {"learning_rate__eta0": [1e-4, 2e-2]}, cv=2).fit(X, y)
    assert search.best_params_ == {"learning_rate__eta0": 2e-2}
    assert search.best_estimator_.score(X, y) > 0.9
    assert est.learning_rate.eta0 == 1e-4  # never modified
    search = GridSearchCV(est, {"learning_rate": ["SGD", "Adam"], "learning_loss": ["square_error", "elastic"]},
                          cv=2).fit(X, y)
    assert search.best_score_ > 0


def test_resume_equals_uninterrupted_run(tmp_path, regression_data, mlp_start):
    X, y = regression_data
    params = dict(learning_rate=LearningRateSGDNesterov(eta0=0.005), batch_size=16, random_state=3)
    full = OrtGradientForwardBackwardOptimizer(mlp_start, max_iter=5, **params).fit(X, y)
    ckpt = tmp_path / "ckpt"
    OrtGradientForwardBackwardOptimizer(mlp_start, max_iter=3, callbacks=[Checkpoint(ckpt)], **params).fit(X, y)
    resumed = OrtGradientForwardBackwardOptimizer(mlp_start, max_iter=5, **params).fit(X, y, resume_from=ckpt)
    for name, value in full.get_state().items():
        np.testing.assert_array_equal(resumed.get_state()[name], value)
    np.testing.assert_array_equal(resumed.train_losses_, full.train_losses_)


def test_pickle_clone_and_warm_start(regression_data, linear_start):
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(linear_start, max_iter=2, warm_start=True, random_state=0).fit(X, y)
    copy = pickle.loads(pickle.dumps(est))
    np.testing.assert_allclose(copy.predict(X), est.predict(X))
    assert clone(est).get_params()["learning_rate"] == 0.01
    state = est.get_state()
    est.fit(X, y)
    assert est.n_iter_ == 4
    est.set_state(state)
    np.testing.assert_array_equal(est.get_state()["coef"], state["coef"])


def test_sample_weight_zero_rows_are_ignored(regression_data, linear_start):
    X, y = regression_data
    weight = np.where(np.arange(len(X)) < 200, 1.0, 0.0)
    y2 = y.copy()
    y2[200:] += 100
    est = OrtGradientForwardBackwardOptimizer(linear_start, max_iter=10, learning_rate=_constant(0.02),
                                              random_state=0).fit(X, y2, sample_weight=weight)
    assert est.score(X[:200], y[:200]) > 0.99


def test_divergence_raises_or_keeps_last_finite_weights(regression_data, linear_start):
    X, y = regression_data
    big = dict(max_iter=20, learning_rate=_constant(50.0), random_state=0)
    with pytest.raises(ConvergenceError, match="diverged"):
        OrtGradientForwardBackwardOptimizer(linear_start, **big).fit(X * 10, y)
    with pytest.warns(RuntimeWarning, match="last finite epoch"):
        est = OrtGradientForwardBackwardOptimizer(linear_start, exc=False, **big).fit(X * 10, y)
    assert est.diverged_
    assert all(np.isfinite(v).all() for v in est.get_state().values())


def test_not_differentiable_model_names_the_node(regression_data):
    from test_fwbw_forward_backward import _round_graph

    X, _ = regression_data
    est = OrtGradientForwardBackwardOptimizer(_round_graph(), max_iter=1)
    with pytest.raises(NotDifferentiableError, match="round_node"):
        est.fit(X[:, :3], X[:, 0])


def test_save_onnx_graph_and_bad_arguments(tmp_path, regression_data, linear_start):
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(linear_start, max_iter=1).fit(X, y)
    paths = est.save_onnx_graph(tmp_path)
    assert {"trained_model", "forward", "training", "backward", "optimized", "loss", "update"} <= set(paths)
    with pytest.raises(ValueError, match="is unknown"):
        OrtGradientForwardBackwardOptimizer(linear_start, learning_loss="hinge_loss").fit(X, y)
    with pytest.raises(ValueError, match="output_name"):
        OrtGradientForwardBackwardOptimizer(linear_start, output_name="nope").fit(X, y)


def test_sklearn_estimator_checks_that_apply(linear_start):
    from sklearn.utils.estimator_checks import (
        check_get_params_invariance,
        check_no_attributes_set_in_init,
        check_set_params,
    )

    est = OrtGradientForwardBackwardOptimizer(linear_start)
    check_no_attributes_set_in_init("OrtGradientForwardBackwardOptimizer", est)
    check_get_params_invariance("OrtGradientForwardBackwardOptimizer", est)
    check_set_params("OrtGradientForwardBackwardOptimizer", est)


@pytest.mark.gpu
def test_cuda_training_matches_cpu(regression_data, linear_start):
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("needs the CUDA build of onnxruntime-training and a GPU")
    X, y = regression_data
    params = dict(max_iter=3, shuffle=False, learning_rate=LearningRateSGDNesterov(eta0=0.01))
    cpu = OrtGradientForwardBackwardOptimizer(linear_start, device="cpu", **params).fit(X, y)
    gpu = OrtGradientForwardBackwardOptimizer(linear_start, device="cuda", **params).fit(X, y)
    np.testing.assert_allclose(gpu.get_state()["coef"], cpu.get_state()["coef"], rtol=1e-4, atol=1e-5)
