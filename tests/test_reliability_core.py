"""Faults injected into the core (docs/RELIABILITY.md, second round): interrupted epochs, untrained outputs,
broadcast labels, corrupt or foreign checkpoints, warm starts that cannot hold, temporary folders."""

import glob
import json
import os
import tempfile
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from sklearn.linear_model import LinearRegression

from ortflow import (
    Checkpoint,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    add_loss_output,
    to_onnx,
)
from ortflow.exceptions import CheckpointError

TRAINERS = [OrtGradientOptimizer, OrtGradientForwardBackwardOptimizer]


@pytest.fixture(scope="module")
def linear(regression_data):
    X, y = regression_data
    return to_onnx(LinearRegression().fit(X[:20], np.zeros(20)))


def _make(cls, onx, **params):
    return cls(add_loss_output(onx) if cls is OrtGradientOptimizer else onx, **params)


class _Interrupt(Exception):
    pass


@pytest.mark.parametrize("cls", TRAINERS)
def test_ctrl_c_mid_epoch_keeps_the_last_epoch_boundary(tmp_path, regression_data, linear, cls):
    """Seen: Ctrl-C mid-epoch wrote mid-epoch weights labelled as the last complete epoch; resuming ended 0.02
    away from an uninterrupted run."""
    X, y = regression_data
    params = dict(max_iter=5, learning_rate=0.01, random_state=0)
    reference = _make(cls, linear, **params).fit(X, y)
    ckpt = tmp_path / "ckpt"
    est = _make(cls, linear, callbacks=[Checkpoint(ckpt, every=1)], **params)
    original = type(est)._train_rows
    calls = []

    def interrupted(self, data, order, learning_rate):
        calls.append(1)
        losses = original(self, data, order, learning_rate)  # the weights moved: mid-epoch state
        if len(calls) == 3:
            raise KeyboardInterrupt
        return losses

    est._train_rows = interrupted.__get__(est)
    with pytest.raises(KeyboardInterrupt):
        est.fit(X, y)
    with pytest.raises(RuntimeError, match="middle of an epoch"):
        est.save_checkpoint(tmp_path / "other")
    resumed = _make(cls, linear, **params).fit(X, y, resume_from=ckpt)
    assert resumed.n_iter_ == 5
    for name, value in reference.get_state().items():
        np.testing.assert_allclose(resumed.get_state()[name], value, rtol=1e-6)


def test_predict_and_score_use_the_trained_output(regression_data):
    """Seen: with the loss on the second output, the train loss was 1e-13 but score() was 0.63."""
    X, y = regression_data
    onx = to_onnx(LinearRegression().fit(X, y))
    doubled = onnx.ModelProto()
    doubled.CopyFrom(onx)
    first = doubled.graph.output[0].name
    doubled.graph.node.append(helper.make_node("Mul", [first, "two"], ["twice"], name="twice"))
    doubled.graph.initializer.append(numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two"))
    doubled.graph.output.insert(0, helper.make_tensor_value_info("twice", TensorProto.FLOAT, ["N", 1]))
    full = OrtGradientOptimizer(add_loss_output(doubled, output_index=1), ["coef", "intercept"], max_iter=3).fit(X, y)
    fwbw = OrtGradientForwardBackwardOptimizer(doubled, ["coef", "intercept"], output_name=first, max_iter=3
                                               ).fit(X, y)
    for est in (full, fwbw):
        assert est.score(X, y) > 0.99
        np.testing.assert_allclose(est.predict(X), LinearRegression().fit(X, y).predict(X), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("cls", TRAINERS)
def test_y_wider_than_a_symbolic_output_is_refused(regression_data, linear, cls):
    """Seen: a symbolic output width let y of shape (N, 2) broadcast into a 1-column model (std 0.0)."""
    X, y = regression_data
    symbolic = onnx.ModelProto()
    symbolic.CopyFrom(linear)
    dim = symbolic.graph.output[0].type.tensor_type.shape.dim[1]
    dim.Clear()
    dim.dim_param = "k"
    with pytest.raises(ValueError, match=r"y has shape \(400, 2\); the model predicts 1 column"):
        _make(cls, symbolic, max_iter=1).fit(X, np.c_[y, y * 2])


@pytest.mark.parametrize("cls", TRAINERS)
def test_corrupt_truncated_or_foreign_checkpoints_are_refused(tmp_path, regression_data, linear, cls):
    """Seen: flipped or truncated files gave raw RuntimeError/BadZipFile, one flipped weight bit loaded silently."""
    X, y = regression_data
    folder = tmp_path / "ckpt"
    est = _make(cls, linear, max_iter=2, random_state=0).fit(X, y)
    est.save_checkpoint(folder)
    state = next(p for p in folder.iterdir() if p.name != "trainer.json")
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit
    state.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        _make(cls, linear, max_iter=3).fit(X, y, resume_from=folder)
    est.save_checkpoint(folder)
    state.write_bytes(state.read_bytes()[:20])
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        _make(cls, linear, max_iter=3).fit(X, y, resume_from=folder)
    est.save_checkpoint(folder)
    (folder / "trainer.json").write_bytes(b"\x00\xff not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        _make(cls, linear, max_iter=3).fit(X, y, resume_from=folder)
    est.save_checkpoint(folder)
    other = to_onnx(LinearRegression().fit(X[:, :8], y))
    other.graph.initializer[0].CopyFrom(numpy_helper.from_array(
        numpy_helper.to_array(other.graph.initializer[0]) + 1, other.graph.initializer[0].name))
    with pytest.raises(CheckpointError, match="written for another graph"):
        _make(cls, other, max_iter=3).fit(X, y, resume_from=folder)


# every kind of runtime state a checkpoint holds: ortflow's step graph (step_state.npz), onnxruntime's own
# checkpoint (ort_checkpoint), the forward-backward optimizer's weights and state (fwbw_state.npz)
STATE_KINDS = [
    pytest.param(OrtGradientOptimizer, "ortflow", id="full-step_state"),
    pytest.param(OrtGradientOptimizer, "onnxruntime", id="full-ort_checkpoint", marks=pytest.mark.training_build),
    pytest.param(OrtGradientForwardBackwardOptimizer, "ortflow", id="fwbw-ortflow"),
    pytest.param(OrtGradientForwardBackwardOptimizer, "onnxruntime", id="fwbw-onnxruntime",
                 marks=pytest.mark.training_build),
]


def flip_a_bit_in_the_random_state(meta_path) -> None:
    """Flip the lowest bit of the first digit from the middle of ``trainer.json`` on: the middle lies in the saved
    random state (624 key words fill most of the file), the file still parses, and the state it holds changed."""
    text = bytearray(meta_path.read_bytes())
    before = json.loads(text)
    i = len(text) // 2
    while not chr(text[i]).isdigit():
        i += 1
    start = text.index(b'"rng_state"')
    assert start < i < text.index(b"]", start), "the middle of trainer.json is not in its random state"
    text[i] ^= 0x01  # '0' <-> '1', '2' <-> '3', ...: still a digit
    meta_path.write_bytes(bytes(text))
    after = json.loads(meta_path.read_bytes())
    assert after["rng_state"] != before["rng_state"] and after["files"] == before["files"]


@pytest.mark.parametrize(("cls", "gradients"), STATE_KINDS)
def test_a_flipped_bit_in_the_checkpoint_metadata_is_refused(tmp_path, regression_data, linear, cls, gradients):
    """Seen: one bit flipped in the middle of trainer.json (in the saved random state) was accepted by
    ``fit(resume_from=...)``, and training went on with another shuffle (coef 3.6e-4 away from an uninterrupted
    run): trainer.json listed the other files' checksums but had none of its own."""
    X, y = regression_data
    params = dict(random_state=0, learning_rate=0.01, gradients=gradients)
    folder = tmp_path / "ckpt"
    _make(cls, linear, max_iter=2, **params).fit(X, y).save_checkpoint(folder)
    flip_a_bit_in_the_random_state(folder / "trainer.json")
    with pytest.raises(CheckpointError, match=r"trainer\.json does not match its checksum"):
        _make(cls, linear, max_iter=4, **params).fit(X, y, resume_from=folder)
    # a trainer.json without a checksum of its own (as ortflow wrote before) cannot be verified either
    _make(cls, linear, max_iter=2, **params).fit(X, y).save_checkpoint(folder)
    meta = json.loads((folder / "trainer.json").read_text())
    del meta["sha256"]
    (folder / "trainer.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"trainer\.json has no checksum of its own"):
        _make(cls, linear, max_iter=4, **params).fit(X, y, resume_from=folder)


@pytest.mark.parametrize("cls", TRAINERS)
def test_warm_start_refuses_changes_it_cannot_honour(regression_data, linear, cls):
    """Seen: warm_start after changing the optimizer ignored the change; after swapping model_onnx it gave a raw
    onnxruntime error and left n_features_in_ wrong."""
    X, y = regression_data
    est = _make(cls, linear, max_iter=2, warm_start=True).fit(X, y)
    est.set_params(learning_rate="adam")
    with pytest.raises(ValueError, match=r"\['learning_rate'\] changed since the last fit"):
        est.fit(X, y)
    est.set_params(learning_rate=0.01, model_onnx=_make(cls, to_onnx(LinearRegression().fit(X[:, :4], y)))
                   .model_onnx)
    with pytest.raises(ValueError, match="model_onnx changed since the last fit"):
        est.fit(X[:, :4], y)
    assert est.n_features_in_ == X.shape[1]
    est.set_params(warm_start=False).fit(X[:, :4], y)
    assert est.n_features_in_ == 4


@pytest.mark.training_build
def test_full_training_leaves_no_temporary_folder_and_no_resource_warning(regression_data, linear):
    """Seen: every full-training fit emitted a ResourceWarning and left an ortflow-full-* folder."""
    X, y = regression_data
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "ortflow-full-*")))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        est = OrtGradientOptimizer(add_loss_output(linear), max_iter=1, gradients="onnxruntime").fit(X, y)
        graphs = est.save_onnx_graph()
        del est
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "ortflow-full-*"))) <= before
    assert {"training_model", "eval_model", "optimizer_model"} <= set(graphs)
