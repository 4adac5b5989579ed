"""Training packages trained outside Python as in Python, for the models exported from PyTorch and for every trainer.

Issue 47, item 6: the LeNet and the transformer encoder exported from PyTorch (tests/reference_models.py) are
fine-tuned from a package exported with ``weights_to_train`` globs (their head: ``fc.*``, ``head.*``; the rest of
the network frozen inside the step graph) in onnxruntime-node and in headless Chromium (onnxruntime-web, wasm); both
end at the head the reference loop :func:`ortflow.package.train_package` reaches, every frozen weight of the graph
they export bit-identical to the exported one. The packages stay bounded: a step of many nodes (the transformer's)
gets few unrolled copies (``ortflow.package.graphs.MAX_UNROLLED_NODES``), a small one (the LeNet's head) all of them.

Issue 44: the package of each trainer (``OrtGradientOptimizer``, ``OrtGradientForwardBackwardOptimizer``,
``TorchTrainer``) of one small MLP trains in the reference loop, onnxruntime-node and headless Chromium to the same
weights, and the three trainers' packages to the same weights as each other.

One Node process and one Chromium page train every package (js/test/train-cases.mjs and train-cases.html, through
js_support.train_jobs). Tolerance: the rule of tests/js_support.py (``state_atol``), the same seed and rows.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import onnx
import pytest

import ortflow
from ortflow.package import TrainingPackage, load_training_state, train_package
from ortflow.package.format import PREDICT_FILE, STEP_FILE
from ortflow.package.graphs import MAX_UNROLLED_NODES

import reference_data
from js_support import JS_GROUP, case_data, optimizer, require_node, state_atol, train_jobs, weights_atol

pytestmark = JS_GROUP
FIT = {"epochs": 2, "shuffle": True, "seed": 47}
#: the head each network is fine-tuned on, and the rows it trains on (3 batches of 32 per epoch)
HEADS = {"lenet": "fc.*", "transformer": "head.*"}
ROWS = 96
TRAINERS = ("full", "fwbw", "torch")
RUNTIMES = ("node", "chromium")
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _head_package(name: str, folder):
    ref = reference_data.load(name)
    est = ortflow.OrtGradientOptimizer(
        ortflow.add_loss_output(ref.model, "log"), batch_size=ref.batch_size, weights_to_train=[HEADS[name]],
        learning_rate=ortflow.LearningRateSGD(eta0=ref.learning_rate, learning_rate="constant"))
    return ortflow.export_training_package(est, folder), ref.inputs[:ROWS], ref.one_hot[:ROWS]


def _trainer_package(kind: str, folder):
    loss_graph, X, y, batch = case_data("mlp")
    settings = dict(batch_size=batch, learning_rate=optimizer("adam"))
    if kind == "full":
        est = ortflow.OrtGradientOptimizer(loss_graph, **settings)
    else:
        prediction = ortflow.graph.editing.keep_outputs(loss_graph, [o.name for o in loss_graph.graph.output
                                                                     if o.name != "loss"])
        cls = ortflow.OrtGradientForwardBackwardOptimizer if kind == "fwbw" else ortflow.TorchTrainer
        est = cls(prediction, learning_loss="squared_error", **settings)
    return ortflow.export_training_package(est, folder), X, y


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """{name: {folder, X, y, reference, node: result, chromium: result}} for the two heads and the trainers'
    packages (``torch`` only where torch is installed)."""
    require_node()
    root = tmp_path_factory.mktemp("portable")
    packages = {name: _head_package(name, root / name) for name in HEADS}
    packages.update({kind: _trainer_package(kind, root / kind) for kind in TRAINERS
                     if kind != "torch" or HAS_TORCH})
    # unrolled: true (not 'auto', which may leave them out of so short a fit): the unrolled graphs run too
    jobs = [{"package": str(folder), "load": {"unrolled": True}, "X": X, "y": y, "fits": [FIT], "predictX": X[:4]}
            for folder, X, y in packages.values()]
    results = {runtime: train_jobs(runtime, jobs, root / f"out-{runtime}", site=root) for runtime in RUNTIMES}
    return {name: {"folder": folder, "X": X, "y": y, "reference": train_package(folder, X, y, **FIT),
                   **{runtime: results[runtime][i] for runtime in RUNTIMES}}
            for i, (name, (folder, X, y)) in enumerate(packages.items())}


def _assert_reaches(entry, runtime: str, what: str):
    """The state ``runtime`` trained holds the reference loop's tensors (the tolerance rule), after as many steps
    (fewer runs: an unrolled graph ran the first two batches of each epoch), and training moved them well beyond
    that tolerance."""
    reference = entry["reference"]
    state = load_training_state(entry["folder"], entry[runtime]["state"])
    assert (state.epochs, state.steps, state.rows_seen) == (reference.epochs, reference.steps, reference.rows_seen)
    package = TrainingPackage(entry["folder"])
    assert reference.steps == FIT["epochs"] * -(-len(entry["X"]) // package.manifest["batch_size"])
    assert entry[runtime]["report"]["runs"] == reference.steps - FIT["epochs"], (what, runtime)
    initial = package.initial_state()
    moved = 0.0
    for name, expected in reference.tensors.items():
        np.testing.assert_allclose(state.tensors[name], expected, rtol=0, atol=state_atol(reference, name),
                                   err_msg=f"{what} on {runtime}: {name}")
        moved = max(moved, float(np.abs(expected - initial.tensors[name]).max()))
    assert moved > 10 * max(weights_atol(reference.steps, w) for w in reference.tensors.values()), what
    losses = [r["loss"] for r in entry[runtime]["report"]["epochs"]]
    assert len(losses) == FIT["epochs"] and losses[-1] < losses[0], (what, runtime, losses)
    return state


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", HEADS)
def test_a_pytorch_models_head_fine_tunes_outside_python(trained, name, runtime):
    """The head's weights reach the reference loop's; the graph the runtime exports (exportModel) is the one
    Python builds from its state, its head the state's, every other initializer (frozen weights, batch-norm
    statistics) the exported network's, bit for bit."""
    entry = trained[name]
    state = _assert_reaches(entry, runtime, name)
    head = TrainingPackage(entry["folder"]).manifest["state"]["weights"]
    assert head == [f"{HEADS[name][:-2]}.weight", f"{HEADS[name][:-2]}.bias"]
    exported = entry[runtime]["model"]
    assert exported == state.trained_onnx_bytes()
    original = ortflow.get_initializers(reference_data.load(name).model)
    after = ortflow.get_initializers(onnx.load_from_string(exported))
    assert sorted(after) == sorted(original)
    for weight, value in after.items():
        if weight in head:
            np.testing.assert_array_equal(value, state.tensors[weight])
        else:
            np.testing.assert_array_equal(value, original[weight], err_msg=f"{name}: frozen {weight} changed")


def test_a_big_steps_package_stays_bounded(trained):
    """The transformer's step (hundreds of nodes: its frozen encoder runs at every step) gets unrolled graphs of at
    most ``MAX_UNROLLED_NODES`` nodes, so its package stays a few times its step and prediction graphs (before the
    bound: 2, 4... 32 steps, 27 times); the LeNet head's small step keeps every unrolled graph up to 32 steps
    (single steps cost little more than a runtime's run overhead: there they pay). Each runtime had them all."""
    for name in HEADS:
        package = TrainingPackage(trained[name]["folder"])
        nodes = len(onnx.load_from_string(package.read(STEP_FILE)).graph.node)
        unrolled = [u["steps"] for u in package.manifest["unrolled"]]
        assert unrolled and max(unrolled) * nodes <= MAX_UNROLLED_NODES, (name, nodes, unrolled)
        for runtime in RUNTIMES:
            assert trained[name][runtime]["report"]["unrolled"] == unrolled, (name, runtime)
        files = package.manifest["files"]
        total = sum(f["bytes"] for f in files.values())
        if name == "lenet":
            assert unrolled == [2, 4, 8, 16, 32]
        else:
            assert nodes > 300 and unrolled == [2, 4]
            assert total <= 6 * (files[STEP_FILE]["bytes"] + files[PREDICT_FILE]["bytes"]), files


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("kind", TRAINERS)
def test_every_trainers_package_trains_alike_outside_python(trained, kind, runtime):
    """Issue 44: the package of each trainer trains in Node and Chromium to the weights of the reference loop, and
    those are the full trainer's package's (the same graph, loss, optimizer, seed and rows)."""
    if kind not in trained:
        pytest.skip("torch is not installed: TorchTrainer's package is not exported")
    entry = trained[kind]
    assert TrainingPackage(entry["folder"]).manifest["trainer"] == {
        "full": "OrtGradientOptimizer", "fwbw": "OrtGradientForwardBackwardOptimizer", "torch": "TorchTrainer"}[kind]
    _assert_reaches(entry, runtime, kind)
    full = trained["full"]["reference"]
    for name, value in entry["reference"].weights.items():
        np.testing.assert_allclose(value, full.weights[name], rtol=0, atol=state_atol(full, name),
                                   err_msg=f"{kind}'s reference against the full trainer's: {name}")
