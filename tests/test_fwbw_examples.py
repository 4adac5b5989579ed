"""The forward-backward examples run and show what they claim."""

import importlib


def test_nesterov_penalty_example_shrinks_weights_and_fits():
    result = importlib.import_module("examples.nesterov_penalty").main(epochs=8)
    assert result["last_loss"] < result["first_loss"] / 2
    assert result["l1_norm_with_penalty"] < result["l1_norm_without_penalty"]
    assert result["r2_with_penalty"] > 0.9


def test_binary_classification_fwbw_example_close_to_sklearn():
    result = importlib.import_module("examples.binary_classification_fwbw").main(epochs=10)
    assert result["last_loss"] < result["first_loss"]
    assert result["accuracy_ortflow"] >= result["accuracy_sklearn"] - 0.03
    assert result["probabilities_shape"][1] == 2
