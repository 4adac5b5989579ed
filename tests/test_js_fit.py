"""The fit API of the JavaScript trainer (issue 47 item 3, issue 45 items 10-12), one Node process per runtime
(js/test/fit-api.mjs, onnxruntime-node and onnxruntime-web's WebAssembly build) for every case: callbacks in
TensorFlow.js's order with the per-epoch record, ``stopTraining`` and an AbortSignal stopping between steps,
validation data and split with ``val_loss`` (evaluate's value), ``evaluate`` against the package's loss graph run by
Python, the History, ``loadState`` round trips (JS -> JS and Python -> JS -> JS -> Python) bit-identical to an
uninterrupted run, ``dispose``, predictions while a fit runs, TypeError/RangeError for bad arguments, ragged rows
and negative sample weights refused naming the row, a second fit while one runs refused (ConcurrentFitError) and the
first one left as if alone."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from sklearn.linear_model import LinearRegression

import ortflow
from ortflow.graph import editing as g
from ortflow.package import TrainingPackage, load_training_state, train_package

from js_support import JS_GROUP, assert_named, make_package, node, optimizer, require_node
from sklearn_fit import quiet_fit
from tolerances import TERM_ROUNDINGS, U32

pytestmark = JS_GROUP
FIT = {"seed": 5, "shuffle": True}


@pytest.fixture(scope="module", params=["node", "web"])
def fit_api(tmp_path_factory, request):
    """Every case run by one node process on onnxruntime-node, or on onnxruntime-web's WebAssembly build."""
    require_node()
    root = tmp_path_factory.mktemp(f"js_fit_{request.param}")
    linear, X, y = make_package("linear", "adam", root / "linear")
    # a forward-backward trainer's package has a sample weight input
    est = ortflow.OrtGradientForwardBackwardOptimizer(ortflow.to_onnx(quiet_fit(LinearRegression(), X, y)),
                                                      learning_rate=optimizer("sgd"), batch_size=16)
    weighted = ortflow.export_training_package(est, root / "weighted")
    python = root / "python.state"
    python.write_bytes(train_package(linear, X, y, epochs=1, **FIT).to_bytes())
    out = root / "out"
    out.mkdir()
    config = root / "config.json"
    config.write_text(json.dumps({"linear": str(linear), "weighted": str(weighted), "X": X.tolist(),
                                  "y": y.tolist(), "python": str(python), "out": str(out)}))
    result = json.loads(node("test/fit-api.mjs", request.param, config, timeout=120).stdout)
    return {**result, "linear": linear, "X": X, "y": y, "python": python, "out": out}


def test_callbacks_history_and_records(fit_api):
    """onTrainBegin, then onBatchEnd per step (batch index within the epoch, its loss and size), onEpochEnd(epoch
    index over the trainer's life, logs), the deprecated onEpoch({epoch: epochs completed, ...logs}), onTrainEnd(last
    logs); the History is TensorFlow.js's shape; logs follow the reference loop's progress."""
    got = fit_api["callbacks"]
    events = got["events"]
    kinds = [e[0] for e in events]
    assert kinds == ["trainBegin", *["batch"] * 4, "epoch", "onEpoch", *["batch"] * 4, "epoch", "onEpoch", "trainEnd"]
    batches = [e for e in events if e[0] == "batch"]
    assert [b[1] for b in batches] == [0, 1, 2, 3] * 2
    assert [b[2]["size"] for b in batches[:4]] == [16, 16, 16, 12]
    assert [b[2]["steps"] for b in batches] == list(range(1, 9))
    epochs = [e for e in events if e[0] == "epoch"]
    assert [e[1] for e in epochs] == [0, 1]
    for k, (_, _, logs) in enumerate(epochs):
        assert set(logs) == {"loss", "steps", "rowsSeen", "learningRate"}
        assert (logs["steps"], logs["rowsSeen"]) == (4 * (k + 1), 60 * (k + 1))
        sizes = [b[2]["size"] for b in batches[4 * k: 4 * k + 4]]
        mean = sum(b[2]["loss"] * s for b, s in zip(batches[4 * k: 4 * k + 4], sizes)) / 60
        assert logs["loss"] == pytest.approx(mean, rel=1e-12)
    assert [e[1]["epoch"] for e in events if e[0] == "onEpoch"] == [1, 2]
    assert events[-1][1] == epochs[-1][2]
    assert got["history"] == {"epoch": [0, 1], "history": {"loss": [e[2]["loss"] for e in epochs]}}
    assert got["again"]["epoch"] == [2] and (got["steps"], got["epochs"]) == (12, 3)
    assert [r["epoch"] for r in got["records"]] == [1, 2, 3]
    reference = train_package(fit_api["linear"], fit_api["X"], fit_api["y"], epochs=3, **FIT)
    assert (reference.steps, reference.rows_seen) == (got["records"][-1]["steps"], got["records"][-1]["rowsSeen"])
    rate = float(np.float32(TrainingPackage(fit_api["linear"]).learning_rate(0)))
    assert all(r["learningRate"] == rate for r in got["records"])


def test_stop_training_and_abort_signal(fit_api):
    """stopTraining set in onBatchEnd stops before the next step (the epoch is not counted: epochs and rowsSeen count
    whole epochs, steps the updates); set in onEpochEnd, after that epoch; an AbortSignal the same; a signal aborted
    before fit trains nothing."""
    assert fit_api["stop_batch"] == {"history": {"epoch": [], "history": {"loss": []}}, "steps": 3, "epochs": 0,
                                     "rowsSeen": 0}
    assert fit_api["stop_epoch"]["history"]["epoch"] == [0]
    assert (fit_api["stop_epoch"]["steps"], fit_api["stop_epoch"]["epochs"]) == (4, 1)
    # the first run is steps_2.onnx (two steps at once): the signal is seen after it
    assert (fit_api["abort"]["steps"], fit_api["abort"]["epochs"]) == (2, 0)
    assert (fit_api["aborted_before"]["steps"], fit_api["aborted_before"]["epochs"]) == (0, 0)


def test_validation_and_evaluate(fit_api):
    """validationSplit keeps the last rows out of training (TensorFlow.js's rule) and reports their loss;
    validationData the same for given rows; both equal evaluate() at the state they were measured at. evaluate()
    is the mean of the package's loss over the rows: Python's onnxruntime running loss.onnx with the same weights."""
    split = fit_api["validation_split"]
    assert split["rowsSeen"] == 2 * 45
    assert len(split["history"]["history"]["val_loss"]) == 2
    assert split["history"]["history"]["val_loss"][-1] == split["evaluate"]
    given = fit_api["validation_data"]
    assert given["history"]["history"]["val_loss"][-1] == given["evaluate"]
    assert given["history"]["history"]["val_loss"][0] > given["evaluate"]
    package = TrainingPackage(fit_api["linear"])
    weights = package.initial_state().weights
    model = g.replace_initializers(onnx.load_from_string(package.read("loss.onnx")), weights)
    X, y = fit_api["X"], fit_api["y"]
    losses = [float(run_graph_loss(model, X[s: s + 16], y[s: s + 16])) * len(X[s: s + 16]) for s in range(0, 60, 16)]
    expected = sum(losses) / len(X)
    # a residual r = x.w + b - y rounds at the scale of its terms S = |x|.|w| + |b| + |y| (TERM_ROUNDINGS each), the
    # squared loss moves by 2|r| times that, and its float32 mean rounds at its own scale
    coef, intercept = weights["coef"].astype(np.float64), weights["intercept"].astype(np.float64)
    residual = np.abs(X @ coef.reshape(-1) + intercept[0] - y).max()
    scale = (np.abs(X) @ np.abs(coef).reshape(-1) + abs(intercept[0]) + np.abs(y)).max()
    atol = 2 * residual * TERM_ROUNDINGS * U32 * scale + TERM_ROUNDINGS * U32 * expected
    assert fit_api["evaluate_initial"] == pytest.approx(expected, rel=0, abs=atol)


def run_graph_loss(model, X, y):
    from ortflow._ort import InferenceSession

    session = InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["loss"], {"X": X, "label": y.reshape(-1, 1)})[0]


def test_load_state_round_trips_are_bit_identical(fit_api):
    """JS -> JS: 2 epochs, the state file, 1 epoch in a new trainer = 3 epochs in one run, byte for byte (the step
    graph with one vector or one tensor per state tensor). Python -> JS -> JS -> Python: Python's state loaded,
    written back unchanged; then 1 + 1 epochs through a state file = 2 epochs in one run, and Python reads it and
    trains on from it as from the uninterrupted run's."""
    for layout in ("flat", "tensors"):
        got = fit_api[f"resume_{layout}"]
        assert got["resumed"] == got["uninterrupted"], layout
    linear, out = fit_api["linear"], fit_api["out"]
    python = load_training_state(linear, fit_api["python"])
    untouched = load_training_state(linear, out / "untouched.state")
    assert (untouched.epochs, untouched.steps, untouched.rows_seen, untouched.rows) == \
        (python.epochs, python.steps, python.rows_seen, python.rows)
    for name, value in python.tensors.items():
        assert untouched.tensors[name].tobytes() == value.tobytes(), name
    assert (out / "resumed.state").read_bytes() == (out / "uninterrupted.state").read_bytes()
    resumed = load_training_state(linear, out / "resumed.state")
    assert (resumed.epochs, resumed.steps, resumed.rows_seen) == (3, 12, 180)
    X, y = fit_api["X"], fit_api["y"]
    on = train_package(linear, X, y, epochs=1, state=resumed, **FIT)
    start = load_training_state(linear, out / "uninterrupted.state")
    uninterrupted = train_package(linear, X, y, epochs=1, state=start, **FIT)
    assert on.to_bytes() == uninterrupted.to_bytes()
    assert fit_api["load_bad"]["name"] == "TrainingPackageError" and "the state given to loadState" in \
        fit_api["load_bad"]["message"]
    assert fit_api["load_other"]["name"] == "TrainingPackageError" and "package" in fit_api["load_other"]["message"]


def test_concurrent_fit_is_refused(fit_api):
    """Issue 45 item 12: a second fit (evaluate, loadState) while one runs is a ConcurrentFitError; the running fit
    ends at the weights it reaches alone."""
    for case in ("concurrent_fit", "concurrent_evaluate", "concurrent_load"):
        assert fit_api[case]["name"] == "ConcurrentFitError", fit_api[case]
        assert "while a fit of this trainer runs" in fit_api[case]["message"]
    assert fit_api["concurrent_state"]["first"] == fit_api["concurrent_state"]["alone"]


def test_predict_while_fitting(fit_api):
    """predict() calls left running while fit goes on all succeed (the prediction session of old weights is released
    when its last run ends; runs of one session go one after the other); the predictions follow each epoch's
    weights."""
    got = fit_api["predict_during_fit"]
    assert got["statuses"] == ["fulfilled"]
    assert len({json.dumps(p) for p in got["perEpoch"]}) == 3
    assert got["last"] == got["perEpoch"][-1]
    # calls started together on one trainer (onnxruntime-web hung on two runs of one session at once)
    assert got["together"][0] == got["together"][1] and got["together"][2] == got["together"][3] == got["last"]


def test_dispose(fit_api):
    """dispose() stops a running fit before its next step and releases the sessions; any later call throws, a
    second dispose() does nothing."""
    got = fit_api["dispose"]
    assert got["epochsDone"] < 50
    for call in ("predict", "fit", "exportState"):
        assert got[call]["thrown"] and "was disposed" in got[call]["message"], call
    assert not got["again"]["thrown"]


@pytest.mark.parametrize("case, error, words", [
    ("epochs_type", "TypeError", ["epochs must be a number"]),
    ("epochs_range", "RangeError", ["epochs=-1 must be an integer >= 0"]),
    ("epochs_fraction", "RangeError", ["epochs=1.5"]),
    ("shuffle_type", "TypeError", ["shuffle must be a boolean"]),
    ("batch_size", "RangeError", ["batchSize=32", "batches of 16 rows"]),
    ("unknown_option", "TypeError", ['unknown keys ["epoch"]']),
    ("callback_type", "TypeError", ["onEpochEnd must be a function"]),
    ("callback_name", "TypeError", ['unknown keys ["onEpochStart"]']),
    ("signal_type", "TypeError", ["signal must be an AbortSignal"]),
    ("split_range", "RangeError", ["validationSplit=1 must lie between 0 and 1"]),
    ("validation_type", "TypeError", ["validationData must be [X, y]"]),
    ("x_type", "TypeError", ["X must give the inputs"]),
    ("evaluate_option", "TypeError", ['unknown keys ["weights"]']),
    ("load_state_type", "TypeError", ["loadState takes the state file's bytes"]),
    ("load_source", "TypeError", ["Trainer.load takes a folder or a URL"]),
    ("load_flat", "TypeError", ['flat="yes" must be true, false or \'auto\'']),
    ("load_providers", "TypeError", ["executionProviders must be an array"]),
    ("load_option", "TypeError", ['unknown keys ["unroled"]']),
    # issue 45 item 10: ragged rows, whether or not the total count matches
    ("ragged_total_kept", "TrainingPackageError", ["X is ragged: row 0 has 6 values",
                                                   'the package\'s "X" takes rows of 5']),
    ("ragged_7_3", "TrainingPackageError", ["X is ragged: row 10 has 7 values"]),
    ("ragged_y", "TrainingPackageError", ["y is ragged: row 4 has 2 values"]),
    ("ragged_y_total_kept", "TrainingPackageError", ["y is ragged: row 4 has 2 values"]),
    # issue 45 item 11: negative weights, as Python's trainers refuse them
    ("negative_weight", "TrainingPackageError", ["sampleWeight has negative values (row 7: -0.5)"]),
    ("zero_weights", "TrainingPackageError", ["sampleWeight is zero everywhere"]),
    ("negative_validation_weight", "TrainingPackageError", ["validationData[2] has negative values (row 0: -1)"]),
])
def test_bad_arguments(fit_api, case, error, words):
    assert_named(fit_api[case], error, words)


def test_good_arguments_still_train(fit_api):
    """The package's own batch size may be given; execution providers may be named; weights of 0 on some rows
    train; a refused call changes nothing."""
    assert fit_api["batch_size_same"] == {"thrown": False, "value": [0]}
    assert fit_api["providers"] == {"thrown": False, "value": [0]}
    assert fit_api["weighted_ok"] == {"thrown": False, "value": [0]}
    assert fit_api["untouched_after_bad"] == {"steps": 4, "epochs": 1}
    assert fit_api["refused_then_fit"] == ["RangeError", "fulfilled", [1]]
