"""Threads chosen by the work: the rule, the fitted attribute, and an explicit n_threads that always wins."""

import numpy as np
import pytest
from sklearn.neural_network import MLPRegressor

from ortflow import OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer, add_loss_output, to_onnx
import ortflow
from ortflow.runtime.sessions import STEP_GRAPH_THREADS_THRESHOLD, THREADS_WORK_THRESHOLD, all_cores, threads_for_work


@pytest.fixture(scope="module")
def small_mlp(regression_data):
    X, y = regression_data
    return to_onnx(MLPRegressor(hidden_layer_sizes=(6,), max_iter=1, random_state=0).fit(X[:50], y[:50]))


def test_small_work_runs_on_one_thread_and_large_work_on_every_core():
    assert threads_for_work(15, 5_000) == 1
    assert threads_for_work(1, THREADS_WORK_THRESHOLD - 1) == 1
    assert threads_for_work(256, THREADS_WORK_THRESHOLD) == all_cores()
    assert threads_for_work(1, STEP_GRAPH_THREADS_THRESHOLD - 1, threshold=STEP_GRAPH_THREADS_THRESHOLD) == 1


def test_full_training_on_step_graphs_keeps_one_thread_longer(regression_data):
    """4M multiply-adds per batch: above forward-backward's threshold, under the step graphs'."""
    X, y = regression_data
    mlp = to_onnx(MLPRegressor(hidden_layer_sizes=(1000,), max_iter=1, random_state=0).fit(X[:50], y[:50]))
    assert THREADS_WORK_THRESHOLD < 400 * 10001 < STEP_GRAPH_THREADS_THRESHOLD
    common = dict(max_iter=1, batch_size=400, shuffle=False)
    assert OrtGradientOptimizer(add_loss_output(mlp), **common).fit(X, y).n_threads_ == 1
    assert OrtGradientForwardBackwardOptimizer(mlp, **common).fit(X, y).n_threads_ == all_cores()
    if ortflow.backend() == "training":  # onnxruntime's artifacts keep forward-backward's threshold
        full = OrtGradientOptimizer(add_loss_output(mlp), gradients="onnxruntime", **common).fit(X, y)
        assert full.n_threads_ == all_cores()


@pytest.mark.parametrize("trainer", ["full", "fwbw"])
def test_default_threads_are_chosen_and_an_explicit_count_wins(regression_data, small_mlp, trainer):
    X, y = regression_data
    if trainer == "full":
        make = lambda **kw: OrtGradientOptimizer(add_loss_output(small_mlp), max_iter=2, batch_size=10,
                                                 shuffle=False, **kw)
    else:
        make = lambda **kw: OrtGradientForwardBackwardOptimizer(small_mlp, max_iter=2, batch_size=10,
                                                                shuffle=False, **kw)
    default = make().fit(X, y)
    assert default.n_threads is None and default.n_threads_ == 1  # 10 rows x 61 weights: far under the threshold
    explicit = make(n_threads=2).fit(X, y)
    assert explicit.n_threads_ == 2
    one = make(n_threads=1).fit(X, y)
    for name, value in default.get_state().items():
        np.testing.assert_array_equal(value, one.get_state()[name])
