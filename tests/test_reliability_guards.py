"""Issue 41 item 17: a graph asking onnxruntime for terabytes, and two threads fitting one estimator."""

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from sklearn.base import clone
from sklearn.linear_model import LinearRegression

from ortflow import Callback, OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer, add_loss_output, to_onnx
from ortflow.exceptions import ConcurrentFitError, OutOfMemoryError

TRAINERS = [OrtGradientOptimizer, OrtGradientForwardBackwardOptimizer]


def _huge_graph(at_run_time: bool):
    """A linear regression plus 0 * sum(ConstantOfShape(shape)): the shape is (20 * 2^16, 3 * 2^22) floats, 6 TiB,
    computed from X's shape at run time, or a constant of 2^20 x 2^20 floats (4 TiB) that onnxruntime folds when
    it initializes the session (std::bad_alloc)."""
    X = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])
    Y = helper.make_tensor_value_info("variable", TensorProto.FLOAT, ["N", 1])
    inits = [numpy_helper.from_array(np.ones((3, 1), np.float32), "coef"),
             numpy_helper.from_array(np.zeros(1, np.float32), "intercept"),
             numpy_helper.from_array(np.zeros(1, np.float32), "zero")]
    if at_run_time:
        inits.append(numpy_helper.from_array(np.array([1 << 16, 1 << 22], np.int64), "scale"))
        shape = [helper.make_node("Shape", ["X"], ["xshape"]), helper.make_node("Mul", ["xshape", "scale"], ["shp"])]
    else:
        inits.append(numpy_helper.from_array(np.array([1 << 20, 1 << 20], np.int64), "shp"))
        shape = []
    nodes = shape + [helper.make_node("ConstantOfShape", ["shp"], ["big"], name="allocate_terabytes"),
                     helper.make_node("ReduceSum", ["big"], ["s"], keepdims=0),
                     helper.make_node("Mul", ["s", "zero"], ["z"]),
                     helper.make_node("MatMul", ["X", "coef"], ["mm"]),
                     helper.make_node("Add", ["mm", "intercept"], ["a"]),
                     helper.make_node("Add", ["a", "z"], ["variable"])]
    graph = helper.make_graph(nodes, "huge", [X], [Y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("cls", TRAINERS)
@pytest.mark.parametrize("at_run_time", [True, False], ids=["run", "init"])
def test_a_graph_allocating_terabytes_is_a_clear_memory_error(cls, at_run_time):
    X = np.random.default_rng(0).random((20, 3), dtype=np.float32)
    y = X.sum(axis=1)
    graph = _huge_graph(at_run_time)
    est = cls(add_loss_output(graph) if cls is OrtGradientOptimizer else graph, max_iter=1)
    with pytest.raises(OutOfMemoryError) as info:
        est.fit(X, y)
    message = str(info.value)
    assert message.startswith("onnxruntime could not allocate memory")
    if at_run_time:  # onnxruntime names the node and the size
        assert "node 'allocate_terabytes' (op ConstantOfShape) asked for a buffer of 6.0 TiB" in message
    else:  # a bare std::bad_alloc: shape inference names the tensor
        assert "'big' (op ConstantOfShape) of shape [1048576, 1048576], 4.0 TiB" in message
    assert isinstance(info.value, MemoryError)


class _FitAgainFromAnotherThread(Callback):
    """At the end of the first epoch, another thread fits the same estimator; its error is kept."""

    def __init__(self):
        self.errors = []

    def on_epoch_end(self, trainer, record):
        if record["epoch"] == 1:
            def other():
                try:
                    trainer.fit(self.X, self.y)
                except Exception as exc:  # noqa: BLE001 - the test looks at it
                    self.errors.append(exc)
            thread = threading.Thread(target=other)
            thread.start()
            thread.join()


@pytest.mark.parametrize("cls", TRAINERS)
def test_two_threads_fitting_one_estimator_is_refused(regression_data, cls):
    """Two threads fitting one estimator at once wrote 61 history records for max_iter=60; the second fit is now
    refused while the first runs, which ends with its own history; a clone fits in parallel."""
    X, y = regression_data
    start = to_onnx(LinearRegression().fit(X[:20], np.zeros(20)))
    callback = _FitAgainFromAnotherThread()
    callback.X, callback.y = X, y
    graph = add_loss_output(start) if cls is OrtGradientOptimizer else start
    est = cls(graph, max_iter=5, callbacks=[callback]).fit(X, y)
    assert len(callback.errors) == 1 and isinstance(callback.errors[0], ConcurrentFitError)
    assert "already fitting in another thread" in str(callback.errors[0])
    assert [r["epoch"] for r in est.history_] == [1, 2, 3, 4, 5]
    est.fit(X, y)  # the lock is released when a fit ends
    assert len(clone(est).set_params(callbacks=None).fit(X, y).history_) == 5


class _FitAgainInThisThread(Callback):
    """At the end of the first epoch: ``fit`` again and ``set_params`` from the fitting thread; the errors kept."""

    def __init__(self, X, y):
        self.X, self.y, self.errors = X, y, []

    def on_epoch_end(self, trainer, record):
        if record["epoch"] == 1:
            for call in (lambda: trainer.fit(self.X, self.y), lambda: trainer.partial_fit(self.X, self.y),
                         lambda: trainer.set_params(batch_size=1)):
                try:
                    call()
                except Exception as exc:  # noqa: BLE001 - the test looks at it
                    self.errors.append(exc)


@pytest.mark.parametrize("cls", TRAINERS)
def test_a_fit_inside_a_fit_and_set_params_during_a_fit_are_refused(regression_data, cls):
    """Issue 45, weak results: a re-entrant fit in the same thread was reported as 'in another thread';
    set_params during a fit was accepted (the running fit went on with the old runtime)."""
    X, y = regression_data
    start = to_onnx(LinearRegression().fit(X[:20], np.zeros(20)))
    callback = _FitAgainInThisThread(X, y)
    graph = add_loss_output(start) if cls is OrtGradientOptimizer else start
    est = cls(graph, max_iter=3, batch_size=10, callbacks=[callback]).fit(X, y)
    assert [type(e) for e in callback.errors] == [ConcurrentFitError] * 3
    fit, partial, params = (str(e) for e in callback.errors)
    assert "fit called on this" in fit and "in the same thread" in fit and "another thread" not in fit
    assert "partial_fit called on this" in partial
    assert "set_params(batch_size) while this" in params and "is fitting" in params
    assert est.batch_size == 10 and len(est.history_) == 3
    assert est.set_params(batch_size=5).batch_size == 5  # after the fit: accepted
