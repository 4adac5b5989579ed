"""Callbacks extend the epoch loop: records, early stopping, progress."""

import io

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

from ortflow import (Callback, EarlyStopping, OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer, ProgressBar,
                     TimeLimit, add_loss_output, to_onnx)


@pytest.fixture(scope="module")
def graph(regression_data):
    X, _ = regression_data
    return add_loss_output(to_onnx(LinearRegression().fit(X[:20], np.zeros(20))))


class Recorder(Callback):
    def __init__(self):
        self.events = []

    def on_train_begin(self, trainer):
        self.events.append("begin")

    def on_epoch_end(self, trainer, record):
        self.events.append(record)

    def on_train_end(self, trainer):
        self.events.append("end")


def test_callback_sees_every_epoch_record(regression_data, graph):
    X, y = regression_data
    recorder = Recorder()
    est = OrtGradientOptimizer(graph, max_iter=4, callbacks=[recorder])
    est.fit(X, y, validation_data=(X[:50], y[:50]))
    assert recorder.events[0] == "begin" and recorder.events[-1] == "end"
    records = recorder.events[1:-1]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    assert records == est.history_
    assert all(r["time"] > 0 and r["validation_loss"] is not None for r in records)


def test_callback_can_stop_training(regression_data, graph):
    class StopAtTwo(Callback):
        def on_epoch_end(self, trainer, record):
            trainer.stop_training_ = record["epoch"] == 2

    X, y = regression_data
    est = OrtGradientOptimizer(graph, max_iter=10, callbacks=[StopAtTwo()]).fit(X, y)
    assert est.n_iter_ == 2


@pytest.mark.parametrize("trainer", ["full", "fwbw"])
def test_max_time_stops_at_the_end_of_the_epoch_that_spends_it(regression_data, graph, trainer):
    """``max_time`` adds a :class:`TimeLimit`: a budget already spent after one epoch stops there, no budget trains
    every epoch, and the time limit says it stopped the fit."""
    X, y = regression_data
    if trainer == "full":
        make = lambda **kw: OrtGradientOptimizer(graph, max_iter=6, **kw)  # noqa: E731
    else:
        model = to_onnx(LinearRegression().fit(X[:20], np.zeros(20)))
        make = lambda **kw: OrtGradientForwardBackwardOptimizer(model, max_iter=6, **kw)  # noqa: E731
    assert make(max_time=1e-9).fit(X, y).n_iter_ == 1
    assert make().fit(X, y).n_iter_ == 6
    limit = TimeLimit(3600.0)
    assert make(callbacks=[limit]).fit(X, y).n_iter_ == 6 and not limit.stopped_
    limit = TimeLimit(1e-9)
    assert make(callbacks=[limit]).fit(X, y).n_iter_ == 1 and limit.stopped_


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), "10", True])
def test_max_time_takes_a_positive_number_of_seconds(regression_data, graph, value):
    X, y = regression_data
    with pytest.raises((TypeError, ValueError), match="max_time"):
        OrtGradientOptimizer(graph, max_iter=2, max_time=value).fit(X, y)


def test_early_stopping_restores_best_weights(regression_data, graph):
    X, y = regression_data
    stopper = EarlyStopping(monitor="train_loss", patience=2, tol=10.0)  # huge tol: never "improves" after epoch 1
    est = OrtGradientOptimizer(graph, max_iter=10, callbacks=[stopper], random_state=0).fit(X, y)
    assert est.n_iter_ == 3 and stopper.best_epoch_ == 1
    for name, value in stopper.best_state_.items():
        np.testing.assert_array_equal(est.get_state()[name], value)


def test_progress_bar_reports_losses(regression_data, graph):
    X, y = regression_data
    stream = io.StringIO()
    OrtGradientOptimizer(graph, max_iter=3, callbacks=[ProgressBar(stream=stream)]).fit(X, y)
    text = stream.getvalue()
    assert "3/3" in text and "loss=" in text
