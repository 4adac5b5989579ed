"""The trainers' parameter table: one name, default and meaning per shared parameter, every one checked in fit."""

import inspect

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.linear_model import LinearRegression

import ortflow
from ortflow import (
    LearningRateAdam,
    LearningRateSGDNesterov,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
    to_onnx,
)
from ortflow.trainers.parameters import FULL, FWBW, SHARED

TRAINERS = [OrtGradientOptimizer, OrtGradientForwardBackwardOptimizer]


@pytest.fixture(scope="module")
def graphs(regression_data):
    X, y = regression_data
    onx = to_onnx(LinearRegression().fit(X[:20], np.zeros(20)))
    return {OrtGradientOptimizer: add_loss_output(onx), OrtGradientForwardBackwardOptimizer: onx}


def test_shared_parameters_have_one_default_in_both_trainers():
    signatures = [inspect.signature(cls.__init__).parameters for cls in TRAINERS]
    for param in SHARED:
        defaults = {sig[param.name].default for sig in signatures}
        assert defaults == {param.default}, param.name
    assert set(signatures[0]) - {"self"} == {"model_onnx", "weights_to_train"} | {p.name for p in SHARED + FULL}
    assert set(signatures[1]) - {"self"} == {"model_onnx", "weights_to_train"} | {p.name for p in SHARED + FWBW}


def test_every_parameter_is_checked_and_documented():
    for cls in TRAINERS:
        for param in cls.parameters[1:]:  # model_onnx is checked by loading it
            assert param.check is not None, f"{cls.__name__}.{param.name} is not checked"
            assert param.doc and param.name in cls.__init__.__doc__


@pytest.mark.parametrize("cls", TRAINERS)
@pytest.mark.parametrize("params, error, match", [
    ({"validation_every": 0}, ValueError, "validation_every=0 must be a positive integer"),
    ({"validation_every": 1.5}, ValueError, r"validation_every=1.5: a float is a fraction of max_iter"),
    ({"n_iter_no_change": -5}, ValueError, "n_iter_no_change=-5 must be a positive integer"),
    ({"tol": float("nan")}, ValueError, "tol=nan must be a finite number >= 0"),
    ({"power_t": float("nan")}, ValueError, "power_t=nan must be a finite number"),
    ({"learning_rate": LearningRateAdam(eta0=-1.0)}, ValueError, "eta0=-1.0 must be a positive"),
    ({"learning_rate": "lbfgs"}, ValueError, "learning_rate='lbfgs' is not a learning rate"),
    ({"shuffle": "yes"}, TypeError, "shuffle='yes' must be True, False or 'portable'"),
    ({"verbose": -1}, ValueError, "verbose=-1 must be an integer >= 0"),
    ({"validation_fraction": 1.0}, ValueError, "validation_fraction=1.0 must be in"),
    ({"n_threads": 0}, ValueError, "n_threads=0 must be a positive integer"),
])
def test_bad_values_are_named_before_any_work(regression_data, graphs, cls, params, error, match):
    X, y = regression_data
    with pytest.raises(error, match=match):
        cls(graphs[cls], max_iter=2, **params).fit(X, y)


def test_weight_decay_and_penalty_must_be_non_negative(regression_data, graphs):
    from ortflow import ElasticLearningPenalty, LearningRateAdamW

    X, y = regression_data
    for cls in TRAINERS:
        with pytest.raises(ValueError, match="weight_decay=-1 must be a finite number >= 0"):
            cls(graphs[cls], max_iter=1, learning_rate=LearningRateAdamW(weight_decay=-1)).fit(X, y)
    with pytest.raises(ValueError, match="l2=-0.1 must be a finite number >= 0"):
        OrtGradientForwardBackwardOptimizer(graphs[OrtGradientForwardBackwardOptimizer], max_iter=1,
                                            learning_penalty=ElasticLearningPenalty(l1=0.0, l2=-0.1)).fit(X, y)
    with pytest.raises(ValueError, match="l2=-0.1 must be a finite number >= 0"):
        add_loss_output(graphs[OrtGradientForwardBackwardOptimizer], penalty={"coef": {"l2": -0.1}})


@pytest.mark.parametrize("cls", TRAINERS)
def test_learning_rate_takes_a_float_a_name_or_an_object(regression_data, graphs, cls):
    X, y = regression_data
    for value in (0.01, "sgd", "SGD", "adam", "adamw", LearningRateAdam(eta0=0.01)):
        est = cls(graphs[cls], max_iter=2, batch_size=20, learning_rate=value, random_state=0).fit(X, y)
        assert est.train_losses_[-1] < est.train_losses_[0], value
        assert est.get_params()["learning_rate"] is value  # stored untouched
    rates = [r["learning_rate"] for r in cls(graphs[cls], max_iter=3, learning_rate=0.2, lr_schedule="invscaling",
                                              power_t=0.5).fit(X, y).history_]
    np.testing.assert_allclose(rates, [0.2 / (k * len(X) + 1) ** 0.5 for k in range(3)])


def test_nesterov_runs_in_full_training_on_ortflows_graphs_only(regression_data, graphs):
    """Every optimizer's rule is written into ortflow's step graph; onnxruntime's artifacts have no momentum
    optimizer, and say which graphs run it."""
    X, y = regression_data
    for value in ("nesterov", LearningRateSGDNesterov()):
        full = OrtGradientOptimizer(graphs[OrtGradientOptimizer], learning_rate=value, gradients="ortflow").fit(X, y)
        assert full.gradients_ == "ortflow" and full.train_losses_[-1] < full.train_losses_[0]
        if ortflow.backend() == "training":
            with pytest.raises(ValueError, match=r"use ortflow's own graphs \(gradients='ortflow'\)"):
                OrtGradientOptimizer(graphs[OrtGradientOptimizer], learning_rate=value,
                                     gradients="onnxruntime").fit(X, y)


@pytest.mark.parametrize("cls", TRAINERS)
def test_validation_every_fraction_of_max_iter(regression_data, graphs, cls):
    """The seed's meaning: a float validates every that fraction of max_iter (0.25 of 8 epochs: every 2)."""
    X, y = regression_data
    est = cls(graphs[cls], max_iter=8, validation_every=0.25, validation_fraction=0.2, random_state=0).fit(X, y)
    measured = [r["epoch"] for r in est.history_ if r["validation_loss"] is not None]
    assert measured == [2, 4, 6, 8]
    assert clone(est).validation_every == 0.25
