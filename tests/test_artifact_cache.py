"""The process-wide cache of full training's artifacts (onnxruntime-training's, ``gradients='onnxruntime'``): a
cached fit equals an uncached one, other settings miss, and the cache stays bounded."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV
from sklearn.neural_network import MLPRegressor

from ortflow import LearningRateAdam, OrtGradientOptimizer, add_loss_output, to_onnx
from ortflow.artifact_cache import TRAINING_ARTIFACTS, ArtifactCache


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
