"""Training the two networks exported from PyTorch (tests/reference_models.py) follows torch's own training, and
fine-tuning the CNN's head leaves every other weight as it was (issue 26, items 2 and 3).

The graphs and torch's loss curves are committed files (tests/data/reference, read by tests/reference_data.py):
the plain onnxruntime build has no torch, so it trains the committed graphs against the committed curves. With
torch installed, a fresh export and a fresh torch run must reproduce those files.

Both sides start from the same weights (the export's initializers), see the same batches in the same order
(no shuffling), minimize the mean softmax cross-entropy of the logits (ortflow's ``log`` loss on the k-column
score with one-hot targets, torch's ``cross_entropy`` on the class indices) by plain SGD at the same rate.
"""

from __future__ import annotations

import numpy as np
import pytest

import ortflow
from ortflow._ort import InferenceSession
from tolerances import assert_close

import reference_data
from reference_data import LOSS_RTOL, NAMES


@pytest.fixture(scope="module", params=NAMES)
def reference(request):
    return reference_data.load(request.param)


def _trainer(ref: reference_data.Reference, kind: str, **overrides):
    settings = dict(max_iter=ref.epochs, learning_rate=ref.learning_rate, lr_schedule="constant",
                    batch_size=ref.batch_size, shuffle=False, **overrides)
    if kind == "full":
        return ortflow.OrtGradientOptimizer(ortflow.add_loss_output(ref.model, "log"), **settings)
    return ortflow.OrtGradientForwardBackwardOptimizer(ref.model, learning_loss="log", **settings)


@pytest.mark.parametrize("kind", ["full", "fwbw"])
def test_training_follows_torch(reference, kind):
    """Every epoch's loss within 2% of torch's (the issue's criterion after 5 epochs, held at every epoch); the
    weights trained by default are torch's parameters: a batch norm's running mean and variance are statistics,
    left as they are."""
    est = _trainer(reference, kind).fit(reference.inputs, reference.one_hot)
    assert est.weights_to_train_ == reference.parameters
    assert len(est.train_losses_) == reference.epochs == len(reference.torch_losses)
    assert_close(est.train_losses_, reference.torch_losses, rtol=LOSS_RTOL, err_msg=f"{reference.name} {kind}")
    assert est.train_losses_[-1] < est.train_losses_[0]
    before = ortflow.get_initializers(reference.model)
    after = ortflow.get_initializers(est.get_trained_onnx())
    for name in set(before) - set(reference.parameters):
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


#: per network: its head, and ops of the layers before it, which the trained graph must not hold
HEADS = {"lenet": (["fc.weight", "fc.bias"], {"Conv", "BatchNormalization", "MaxPool", "Relu"}),
         "transformer": (["head.weight", "head.bias"], {"Gather", "MatMul", "Softmax", "LayerNormalization", "Erf"})}


@pytest.mark.parametrize("kind", ["full", "fwbw"])
def test_fine_tuning_the_head(reference, kind):
    """``weights_to_train=['fc.*']`` (the CNN) or ``['head.*']`` (the transformer): every other weight and
    statistic stays bit-identical, the layers before the head form the frozen prefix (the trained graph holds none
    of their ops: no Conv, no attention), and the trained graph keeps the exported inputs and outputs and runs in a
    plain InferenceSession."""
    head, frozen_ops = HEADS[reference.name]
    est = _trainer(reference, kind, weights_to_train=[head[0].split(".")[0] + ".*"])
    est.fit(reference.inputs, reference.one_hot)
    assert est.weights_to_train_ == head
    assert est.train_losses_[-1] < est.train_losses_[0]
    trainable_ops = {node.op_type for node in est._train_model.graph.node}
    assert not trainable_ops & frozen_ops, trainable_ops
    assert "Gemm" in trainable_ops

    before = ortflow.get_initializers(reference.model)
    trained = est.get_trained_onnx()
    after = ortflow.get_initializers(trained)
    assert sorted(after) == sorted(before)
    for name in set(before) - set(head):
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    assert not np.array_equal(after[head[0]], before[head[0]])

    original = reference.model.graph
    assert [i.SerializeToString() for i in trained.graph.input] == [i.SerializeToString() for i in original.input]
    assert [o.SerializeToString() for o in trained.graph.output] == [o.SerializeToString() for o in original.output]
    sess = InferenceSession(trained.SerializeToString(), providers=["CPUExecutionProvider"])
    logits = sess.run(None, {reference.input_name: reference.inputs})[0]
    np.testing.assert_array_equal(logits, est.predict(reference.inputs))


def test_committed_files_are_current(tmp_path):
    """A fresh export and torch run (``python -m tests.reference_models --write``) reproduce the committed files:
    the graph byte for byte, the data and settings exactly, torch's loss curve within the tolerance the trainers are
    held to (it is float32 arithmetic, rounded differently on another CPU). Another torch version exports another
    graph (seen with torch 2.11: issue 39): the graph is compared only under the torch that wrote it (its
    ``producer_version``), and the test says so as a skip once the rest is checked."""
    torch = pytest.importorskip("torch")
    import reference_models

    other_writer = []
    for name in NAMES:
        exported, arrays = reference_models.reference_run(name)
        committed = reference_data.load(name)
        hint = f"{name}: run `python -m tests.reference_models --write` and commit tests/data/reference"
        if torch.__version__.split("+")[0] == committed.model.producer_version:
            assert exported.SerializeToString() == committed.model.SerializeToString(), hint
        else:
            other_writer.append(f"{name} (written by torch {committed.model.producer_version})")
        stored = np.load(reference_data.FOLDER / f"{name}.npz")
        assert sorted(stored.files) == sorted(arrays), hint
        for key, value in arrays.items():
            if key != "torch_losses":
                np.testing.assert_array_equal(stored[key], value, err_msg=f"{key}; {hint}")
        assert_close(arrays["torch_losses"], stored["torch_losses"], rtol=LOSS_RTOL, err_msg=hint)
    if other_writer:
        pytest.skip(f"data, settings and losses checked; the exported graphs not compared: torch "
                    f"{torch.__version__} is not the version that wrote {', '.join(other_writer)}")
