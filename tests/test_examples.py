"""The examples run and show what they claim."""

import importlib

import pytest


def _main(name, **kwargs):
    return importlib.import_module(f"examples.{name}").main(**kwargs)


def test_linear_regression_example_matches_sklearn():
    result = _main("linear_regression")
    assert result["max_coef_gap"] < 0.02
    assert result["r2_ortflow"] > result["r2_sklearn"] - 0.005


def test_mlp_example_learns_and_exports():
    result = _main("mlp_regression")
    assert result["last_loss"] < result["first_loss"] / 3
    assert result["exported_matches"]
    assert {"trained_model", "training_step"} <= set(result["graphs"])  # full training on ortflow's own graph


def test_binary_classification_example_close_to_sklearn():
    result = _main("binary_classification")
    assert result["accuracy_ortflow"] >= result["accuracy_sklearn"] - 0.03
    assert result["probabilities_shape"][1] == 2


@pytest.mark.parametrize("name", ["nesterov_penalty", "binary_classification_fwbw"])
def test_forward_backward_examples_run(name):
    spec = importlib.util.find_spec(f"examples.{name}")
    if spec is None:
        pytest.fail(f"examples/{name}.py is missing")
    result = _main(name)
    assert result["last_loss"] < result["first_loss"]


def test_torch_mixed_model_example_trains_end_to_end():
    pytest.importorskip("torch")
    result = _main("torch_mixed_model", epochs=6)
    assert result["last_loss"] < result["first_loss"] / 3
    assert result["exported_matches"] and result["first_layer_got_gradient"]
