"""ortflow's gradients of two networks exported from PyTorch (tests/reference_models.py) equal torch autograd's:
a LeNet-style CNN on scikit-learn's 8x8 digits and a two-layer transformer encoder over int64 tokens.

The loss is torch's cross-entropy of the logits; its gradient with respect to the logits (from torch) is the
upstream gradient of ortflow's graph of sum(logits * G), which then gives every weight's gradient by the chain
rule."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ortflow  # noqa: E402
from ortflow._ort import InferenceSession  # noqa: E402
from ortflow.autodiff import nodes_without_rule  # noqa: E402
from tolerances import assert_close, float32_sum_atol  # noqa: E402

import reference_models  # noqa: E402


def _digits(rows):
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images[:rows] / 16.0).astype(np.float32).reshape(rows, 1, 8, 8)
    return images, digits.target[:rows].astype(np.int64)


def _tokens(rows):
    rng = np.random.default_rng(0)
    return rng.integers(0, reference_models.VOCAB, size=(rows, reference_models.SEQ)), rng.integers(0, 2, rows)


def _torch_gradients(model, inputs, labels):
    """torch's gradients of the mean cross-entropy with respect to every parameter, and to the logits."""
    logits = model(torch.from_numpy(inputs))
    loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels))
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, [logits, *params.values()])
    return grads[0].numpy(), {name: g.numpy() for name, g in zip(params, grads[1:])}


def _ours(onx, weights, input_name, inputs, upstream):
    """Our gradients for the whole batch, and per weight element the sum over rows of each row's absolute
    gradient: the magnitude of the terms the batch gradient adds up."""
    derivative = ortflow.onnx_derivative(onx, weights=list(weights), fill_grad=False)
    assert {n.domain for n in derivative.graph.node} <= {""}
    sess = InferenceSession(derivative.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    feeds = {input_name: inputs, **weights}
    batch = dict(zip(names, sess.run(None, {**feeds, "logits_grad": upstream})))
    terms = {name: np.zeros(value.shape) for name, value in batch.items()}
    for i in range(len(inputs)):
        row = sess.run(None, {**feeds, input_name: inputs[i: i + 1], "logits_grad": upstream[i: i + 1]})
        for name, value in zip(names, row):
            terms[name] += np.abs(value.astype(np.float64))
    return batch, terms


def _compare(model, example, input_name, inputs, labels, inner_terms):
    """Every parameter of ``model`` is an initializer of the export, under its torch name; its gradient matches
    torch's within rtol 1e-4 plus the float32 rounding of a sum of ``rows * inner_terms`` terms (each row's
    gradient sums ``inner_terms`` positions: pixels, tokens) of the magnitudes the rows give."""
    onx = reference_models.export(model, example, input_name)
    initializers = ortflow.get_initializers(onx)
    params = {name: p.detach().numpy() for name, p in model.named_parameters()}
    assert set(params) <= set(initializers), sorted(set(params) - set(initializers))
    for name, value in params.items():
        np.testing.assert_array_equal(initializers[name], value, err_msg=name)
    assert nodes_without_rule(onx, list(params), "logits") == []
    upstream, expected = _torch_gradients(model, inputs, labels)
    ours, terms = _ours(onx, params, input_name, inputs, upstream)
    assert sorted(ours) == sorted(f"{name}_grad" for name in params)
    for name, value in expected.items():
        # the elements of one weight sum the same kind of terms (same rows, same positions): one whose terms cancel
        # within each row (the attention's key bias: softmax ignores a shift shared by all keys, so its gradient
        # is rounding noise) still sums terms of the size the others show
        magnitude = np.maximum(terms[f"{name}_grad"], terms[f"{name}_grad"].mean())
        atol = float32_sum_atol(magnitude, len(inputs) * inner_terms)
        assert_close(ours[f"{name}_grad"], value, rtol=1e-4, atol=atol, err_msg=name)
    return onx


def test_lenet_gradients_match_torch():
    images, labels = _digits(32)
    onx = _compare(reference_models.lenet(), torch.from_numpy(images[:2]), "X", images, labels, 8 * 8)
    ops = {n.op_type for n in onx.graph.node}
    assert {"Conv", "BatchNormalization", "MaxPool", "GlobalAveragePool"} <= ops


def test_transformer_gradients_match_torch():
    tokens, labels = _tokens(16)
    onx = _compare(reference_models.transformer(), torch.from_numpy(tokens[:2]), "tokens", tokens, labels,
                   reference_models.SEQ ** 2)
    ops = {n.op_type for n in onx.graph.node}
    assert {"Gather", "LayerNormalization", "Erf", "Softmax"} <= ops
