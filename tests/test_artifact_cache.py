"""The process-wide caches of full training: onnxruntime-training's artifacts (``gradients='onnxruntime'``) and
ortflow's step graphs with their sessions. A cached fit equals an uncached one, fits sharing a session share no
state, other settings miss, and the caches stay bounded."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV
from sklearn.neural_network import MLPRegressor

from ortflow import LearningRateAdam, OrtGradientOptimizer, add_loss_output, to_onnx
from ortflow.runtime.artifact_cache import STEP_GRAPHS, TRAINING_ARTIFACTS, ArtifactCache


@pytest.fixture(scope="module")
def loss_graph(regression_data):
    X, y = regression_data
    return add_loss_output(to_onnx(MLPRegressor(hidden_layer_sizes=(6,), max_iter=1, random_state=0).fit(X[:50],
                                                                                                        y[:50])))


@pytest.fixture
def empty_cache():
    TRAINING_ARTIFACTS.clear()
    yield TRAINING_ARTIFACTS
    TRAINING_ARTIFACTS.clear()


def _fit(graph, X, y, **kw):
    kw = {"learning_rate": 0.01, **kw}
    return OrtGradientOptimizer(graph, max_iter=3, batch_size=10, random_state=0, gradients="onnxruntime",
                                **kw).fit(X, y)


def test_fits_of_one_graph_share_step_sessions_but_no_state(regression_data, loss_graph):
    X, y = regression_data
    STEP_GRAPHS.clear()
    options = dict(max_iter=3, batch_size=10, random_state=0, gradients="ortflow", learning_rate=0.01)
    first = OrtGradientOptimizer(loss_graph, **options).fit(X, y)
    built = (STEP_GRAPHS.misses, len(STEP_GRAPHS))
    assert built == (2, 2)  # the symbolic graph, and the graph for batches of 10 rows with its session
    other = OrtGradientOptimizer(loss_graph, **options).fit(X[:200], -y[:200])  # another fit, between the two
    second = OrtGradientOptimizer(loss_graph, **options).fit(X, y)
    assert (STEP_GRAPHS.misses, STEP_GRAPHS.hits) == (2, 4)
    for name, value in first.get_state().items():
        np.testing.assert_array_equal(second.get_state()[name], value)
        assert not np.allclose(other.get_state()[name], value)
    OrtGradientOptimizer(loss_graph, **{**options, "learning_rate": "adam"}).fit(X, y)  # another update: built
    assert STEP_GRAPHS.misses == 4
    STEP_GRAPHS.clear()


@pytest.mark.training_build
def test_a_cached_fit_ends_with_the_weights_of_an_uncached_one(regression_data, loss_graph, empty_cache):
    X, y = regression_data
    first = _fit(loss_graph, X, y)
    assert (empty_cache.misses, empty_cache.hits, len(empty_cache)) == (1, 0, 1)
    second = _fit(loss_graph, X, y)
    assert (empty_cache.misses, empty_cache.hits) == (1, 1)
    for name, value in first.get_state().items():
        np.testing.assert_array_equal(second.get_state()[name], value)
    assert second.save_onnx_graph() == first.save_onnx_graph()  # the same artifacts, as bytes


@pytest.mark.training_build
def test_other_settings_miss_the_cache(regression_data, loss_graph, empty_cache):
    X, y = regression_data
    _fit(loss_graph, X, y)
    _fit(loss_graph, X, y, learning_rate="adam")  # another optimizer
    _fit(loss_graph, X, y, learning_rate=LearningRateAdam(beta1=0.8))  # the same optimizer, other moments
    _fit(loss_graph, X, y, weights_to_train=["coef_0", "intercept_0"])  # other weights trained
    assert (empty_cache.misses, empty_cache.hits, len(empty_cache)) == (4, 0, 4)
    _fit(loss_graph, X, y, n_threads=2, learning_rate=0.02)  # neither threads nor the rate's value are in the graphs
    assert empty_cache.hits == 1


@pytest.mark.training_build
def test_grid_search_clones_reuse_the_artifacts(regression_data, loss_graph, empty_cache):
    X, y = regression_data
    search = GridSearchCV(clone(OrtGradientOptimizer(loss_graph, max_iter=2, batch_size=10, gradients="onnxruntime")),
                          {"learning_rate": [0.01, 0.001]}, cv=2).fit(X, y)
    assert search.best_estimator_.n_iter_ == 2
    assert empty_cache.misses == 1 and empty_cache.hits >= 4  # 2 rates x 2 folds + the refit, one generation


def test_the_cache_is_bounded():
    cache = ArtifactCache(max_entries=2, max_bytes=10)
    for i in range(3):
        cache.put(str(i), {"a": b"x" * 4})
    assert len(cache) == 2 and cache.get("0") is None and cache.get("2") is not None
    cache.put("big", {"a": b"x" * 11})  # larger than the whole cache: not kept
    assert cache.get("big") is None and cache.nbytes <= 10
