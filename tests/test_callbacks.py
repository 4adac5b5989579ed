"""Callbacks extend the epoch loop: records, early stopping, progress."""

import io

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

from ortflow import Callback, EarlyStopping, OrtGradientOptimizer, ProgressBar, add_loss_output, to_onnx


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
