"""Checkpoints: resuming gives the same weights as an uninterrupted run with the same seed."""

import json

import numpy as np
import pytest
from sklearn.neural_network import MLPRegressor

from ortflow import Checkpoint, LearningRateAdam, OrtGradientOptimizer, add_loss_output, to_onnx


@pytest.fixture(scope="module")
def mlp_graph(regression_data):
    X, y = regression_data
    return add_loss_output(to_onnx(MLPRegressor(hidden_layer_sizes=(8,), max_iter=1, random_state=0).fit(X, y)))


@pytest.mark.parametrize("rate", [0.005, LearningRateAdam(eta0=0.005)])
def test_resume_equals_uninterrupted_run(tmp_path, regression_data, mlp_graph, rate):
    X, y = regression_data
    params = dict(learning_rate=rate, random_state=3, lr_schedule="invscaling")
    full = OrtGradientOptimizer(mlp_graph, max_iter=6, **params).fit(X, y)
    ckpt = tmp_path / "ckpt"
    OrtGradientOptimizer(mlp_graph, max_iter=4, callbacks=[Checkpoint(ckpt, every=2)], **params).fit(X, y)
    meta = json.loads((ckpt / "trainer.json").read_text())
    assert meta["epoch"] == 4
    resumed = OrtGradientOptimizer(mlp_graph, max_iter=6, **params).fit(X, y, resume_from=ckpt)
    assert resumed.n_iter_ == 6
    for name, value in full.get_state().items():
        np.testing.assert_array_equal(resumed.get_state()[name], value)
    np.testing.assert_array_equal(resumed.train_losses_, full.train_losses_)


def test_resume_from_a_folder_without_checkpoint_is_an_error(tmp_path, regression_data, mlp_graph):
    X, y = regression_data
    with pytest.raises(FileNotFoundError, match="holds no ortflow checkpoint"):
        OrtGradientOptimizer(mlp_graph, max_iter=2).fit(X, y, resume_from=tmp_path)
