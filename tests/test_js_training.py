"""The JavaScript trainer (js/) on onnxruntime-node and on onnxruntime-web's WebAssembly engine (in Node): training
packages of issue 38's models (linear regressor, MLP regressor, binary and 10-class classifiers, the exported LeNet),
each with SGD (invscaling schedule) and Adam, end at the weights Python's reference loop
(:func:`ortflow.package.train_package`) reaches on the same shuffled batches, and the trained graph JavaScript
exports predicts what the Python-trained graph predicts. One node process per runtime trains every package; by default
the package's unrolled graphs ``steps_<K>.onnx`` run the full batches (3 per epoch of these packages: one run of 2
steps) and ``step_flat.onnx`` the rest (the state as one vector), ``node-tensors`` runs ``step.onnx``.

Tolerances: weights, the rule of tests/js_support.py (``2 * steps * TERM_ROUNDINGS * u32 * max|w|`` per tensor).
Predictions: ``output_atol`` of tests/js_support.py.
"""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
from sklearn.datasets import make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor

import ortflow
from ortflow.package import TrainingPackage, load_training_state, train_package
from ortflow.optimizers.schedules import learning_rate_at
from ortflow.data.shuffle import draws, epoch_order, seed_state

from js_support import (CASES, JS_GROUP, OPTIMIZERS, RUNTIMES, make_package, node, optimizer, output_atol,
                        require_node, run_graph, state_atol, weights_atol, write_jobs)

pytestmark = JS_GROUP
FIT = {"epochs": 3, "shuffle": True, "seed": 2026}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Every package trained by the reference loop and by both runtimes: {(case, opt): {...}}."""
    require_node()
    root = tmp_path_factory.mktemp("js_packages")
    cases, jobs = {}, {r: [] for r in RUNTIMES}
    for case in CASES:
        for opt in OPTIMIZERS:
            folder, X, y = make_package(case, opt, root / f"{case}-{opt}")
            reference = train_package(folder, X, y, **FIT)
            cases[case, opt] = {"folder": folder, "X": X, "y": y, "reference": reference}
            # Adam's linear case trains in two calls (2 + 1 epochs): the step count, the epochs (the shuffle's) and
            # the rows seen (the schedule's) continue across fit() calls
            fits = [{**FIT, "epochs": 2}, {**FIT, "epochs": 1}] if (case, opt) == ("linear", "adam") else [FIT]
            for runtime, (_, load) in RUNTIMES.items():
                out = root / f"{case}-{opt}-{runtime}"
                jobs[runtime].append({"package": str(folder), "load": load, "X": X, "y": y, "fits": fits,
                                      "state": f"{out}.state", "model": f"{out}.onnx", "predictX": X,
                                      "prediction": f"{out}.json"})
    for runtime, (kind, _) in RUNTIMES.items():
        node("test/train-cases.mjs", kind, write_jobs(root / f"jobs-{runtime}.json", jobs[runtime]))
    for runtime in RUNTIMES:
        for job in jobs[runtime]:
            error = f"{job['state']}.error.json"
            assert not os.path.exists(error), open(error).read()
    return cases, root


def _result(trained, case, opt, runtime):
    cases, root = trained
    out = root / f"{case}-{opt}-{runtime}"
    return cases[case, opt], load_training_state(cases[case, opt]["folder"], f"{out}.state"), out


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("case", CASES)
def test_weights_match_python_reference(trained, case, opt, runtime):
    entry, state, _ = _result(trained, case, opt, runtime)
    reference = entry["reference"]
    assert (state.epochs, state.steps, state.rows_seen, state.rows) == \
        (reference.epochs, reference.steps, reference.rows_seen, reference.rows)
    assert reference.steps > 0
    initial = TrainingPackage(entry["folder"]).initial_state()
    moved = 0.0
    for name, expected in reference.tensors.items():
        atol = state_atol(reference, name)
        np.testing.assert_allclose(state.tensors[name], expected, rtol=0, atol=atol,
                                   err_msg=f"{case}/{opt} on {runtime}: {name}")
        moved = max(moved, float(np.abs(expected - initial.tensors[name]).max()))
    # training moved the weights well beyond the tolerance: a JS loop that skipped steps would fail
    assert moved > 10 * max(weights_atol(reference.steps, w) for w in reference.tensors.values())


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("case", CASES)
def test_exported_model_predicts_like_python(trained, case, opt, runtime):
    """exportModel() is exactly the graph Python builds from the exported state, and it predicts (in Python's
    onnxruntime) what the Python-trained graph predicts; predict() in JavaScript gives the same first output."""
    entry, state, out = _result(trained, case, opt, runtime)
    exported = (out.parent / f"{out.name}.onnx").read_bytes()
    assert exported == state.trained_onnx_bytes()
    X, reference = entry["X"], entry["reference"]
    ours, theirs = run_graph(exported, X), run_graph(reference.trained_onnx_bytes(), X)
    atol = output_atol(reference, X)
    scores = [n for n, v in theirs.items() if v.dtype.kind == "f"]
    assert scores
    for name in scores:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=0, atol=atol, err_msg=f"{case}/{opt} {name}")
    labels = [n for n, v in theirs.items() if v.dtype.kind != "f"]
    if labels:  # a classifier: the same label wherever the Python-trained probabilities leave a margin
        probabilities = np.sort(theirs[scores[0]].reshape(len(X), -1), axis=1)
        clear = (probabilities[:, -1] - probabilities[:, -2] > 2 * atol) if probabilities.shape[1] > 1 else \
            np.ones(len(X), bool)
        assert clear.mean() > 0.5
        np.testing.assert_array_equal(ours[labels[0]][clear], theirs[labels[0]][clear])
    predicted = json.loads((out.parent / f"{out.name}.json").read_text())
    first = next(iter(ours.values()))
    if first.dtype.kind in "fc":
        np.testing.assert_allclose(np.asarray(predicted["values"], np.float64).reshape(first.shape), first,
                                   rtol=0, atol=atol)
    else:
        np.testing.assert_array_equal(np.asarray(predicted["values"], dtype=first.dtype), first)
    assert predicted["flat"] is (runtime != "node-tensors")
    losses = [r["loss"] for r in predicted["epochs"]]
    assert [r["epoch"] for r in predicted["epochs"]] == [1, 2, 3] and losses[-1] < losses[0]


def test_shuffle_and_schedules_follow_python():
    """epochOrder and its draws are ortflow.data.shuffle's, bit for bit (seeds and epochs across the 32-bit range);
    every schedule's rate, fed as float32, is ortflow.optimizers.schedules'."""
    require_node()
    cases = [(10, 42, 3), (12, 2026, 0), (1000, 0xFFFFFFFF, 7), (257, 123456789, 65537), (1, 5, 0), (0, 1, 1)]
    schedules = [{"name": "invscaling", "eta0": 0.05, "power_t": 0.25, "alpha": 1e-4},
                 {"name": "optimal", "eta0": 0.01, "power_t": 0.5, "alpha": 3e-4},
                 {"name": "optimal_sklearn", "eta0": 0.01, "power_t": 0.5, "alpha": 3e-4},
                 {"name": "constant", "eta0": 0.01, "power_t": 0.25, "alpha": 1e-4}]
    seen = [0, 1, 60, 180, 12345, 10 ** 7]
    script = (
        "import {epochOrder, mulberry32, seedState, learningRateAt} from './index.js';"
        f"const cases = {json.dumps(cases)}; const schedules = {json.dumps(schedules)}; const seen = {seen};"
        "const next = mulberry32(seedState(42, 3));"
        "console.log(JSON.stringify({orders: cases.map(([n, s, e]) => Array.from(epochOrder(n, s, e))),"
        " draws: Array.from({length: 5}, next),"
        " rates: schedules.map((s) => seen.map((t) => Math.fround(learningRateAt(s, t))))}));"
    )
    got = json.loads(node("--input-type=module", "-e", script).stdout)
    for (n, seed, epoch), order in zip(cases, got["orders"]):
        assert order == epoch_order(n, seed, epoch).tolist(), (n, seed, epoch)
    assert got["draws"] == draws(seed_state(42, 3), 5)
    for s, rates in zip(schedules, got["rates"]):
        expected = [float(np.float32(learning_rate_at(s["name"], s["eta0"], t, s["power_t"], s["alpha"])))
                    for t in seen]
        assert rates == expected, s["name"]


def _unrolled_package(tmp_path):
    """An MLP's package with unrolled graphs of 2, 4 and 8 steps, and its 230 rows (batches of 16)."""
    X, y = make_regression(230, n_features=5, noise=1.0, random_state=1)
    X, y = X.astype(np.float32), (y / 50).astype(np.float32)
    mlp = MLPRegressor(hidden_layer_sizes=(8,), max_iter=1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp.fit(X, y)
    est = ortflow.OrtGradientOptimizer(ortflow.add_loss_output(ortflow.to_onnx(mlp), "squared_error"),
                                       learning_rate=optimizer("adam"), batch_size=16)
    folder = ortflow.export_training_package(est, tmp_path / "pkg", max_unrolled=8)
    assert [u["steps"] for u in TrainingPackage(folder).manifest["unrolled"]] == [2, 4, 8]
    return folder, X, y


def _train_node(tmp_path, name, kind, load, folder, X, y, fits, fails=False):
    """The report and the state of a job of js/test/train-cases.mjs; with ``fails``, the error it wrote."""
    job = {"package": str(folder), "load": load, "X": X, "y": y, "fits": fits, "state": str(tmp_path / name),
           "prediction": str(tmp_path / f"{name}.json"), "predictX": X[:2]}
    node("test/train-cases.mjs", kind, write_jobs(tmp_path / f"{name}-jobs.json", [job]))
    error = tmp_path / f"{name}.error.json"
    if fails:
        return json.loads(error.read_text())
    assert not error.exists(), error.read_text()
    return json.loads((tmp_path / f"{name}.json").read_text()), load_training_state(folder, tmp_path / name)


def test_unrolled_runs_reach_the_single_step_weights(tmp_path):
    """A package with unrolled graphs of 2, 4 and 8 steps, 230 rows in batches of 16 (14 full batches and 6 rows,
    not a multiple of 8 * 16): each epoch runs steps_8, steps_4, steps_2, then step_flat for the short batch (4 runs
    instead of 15), on onnxruntime-node and WebAssembly, and ends at the weights of the reference loop's single steps
    (the tolerance rule) with ``unrolled: true``; with ``unrolled: false``, and with the default ``'auto'`` (45 steps don't pay
for an unrolled graph's creation), node runs 15 steps per epoch to the same weights."""
    require_node()
    folder, X, y = _unrolled_package(tmp_path)
    reference = train_package(folder, X, y, **FIT)
    runs = {"node": ("node", {"unrolled": True}), "web": ("web", {"unrolled": True}),
            "node-single": ("node", {"unrolled": False}), "node-auto": ("node", {})}
    for name, (kind, load) in runs.items():
        done, state = _train_node(tmp_path, name, kind, load, folder, X, y, [FIT])
        # 'auto' (the default): 45 steps never pay for an unrolled graph's creation
        assert done["runs"] == 3 * (15 if name in ("node-single", "node-auto") else 4), name
        assert done["unrolled"] == ([] if name == "node-single" else [2, 4, 8])
        assert (state.steps, state.epochs) == (reference.steps, 3) and reference.steps == 45
        for tensor, expected in reference.tensors.items():
            np.testing.assert_allclose(state.tensors[tensor], expected, rtol=0,
                                       atol=weights_atol(reference.steps, expected), err_msg=f"{name}: {tensor}")
        losses = [r["loss"] for r in done["epochs"]]
        assert losses[-1] < losses[0]



def test_a_long_auto_fit_reads_the_unrolled_graphs_in_the_background_and_runs_them(tmp_path):
    """The default ``unrolled: 'auto'`` over a fit long enough (2,000 epochs, 30,000 steps) to pay for an unrolled
    graph's creation many times over: the fit reads the graph while single steps go on, then runs it (fewer runtime
    runs than steps), and reaches the weights of single steps on the same runtime (the tolerance rule; Python's
    reference loop on another onnxruntime drifts further over 30,000 Adam steps than the rule's bound)."""
    require_node()
    folder, X, y = _unrolled_package(tmp_path)
    fit = {**FIT, "epochs": 2000}
    done, state = _train_node(tmp_path, "auto", "node", {}, folder, X, y, [fit])
    single, reference = _train_node(tmp_path, "single", "node", {"unrolled": False}, folder, X, y, [fit])
    assert (state.steps, state.epochs) == (reference.steps, 2000) and reference.steps == 30_000
    # 8 runs an epoch once steps_2 runs (16,000 in all had it run from the start), 4 once steps_8 does
    assert single["runs"] == 30_000 and done["runs"] < reference.steps * 0.9, done["runs"]
    for tensor, expected in reference.tensors.items():  # the same runtime: equal here (the rule covers another CPU)
        np.testing.assert_allclose(state.tensors[tensor], expected, rtol=0,
                                   atol=weights_atol(reference.steps, expected), err_msg=tensor)


def test_an_unrolled_graph_read_in_the_background_that_fails_its_checksum_stops_the_fit(tmp_path):
    """'auto' reads an unrolled graph while single steps go on; a file that does not match the manifest's checksum is
    thrown by the fit's next step, naming the file, as ``unrolled: true`` throws it (tests/test_js_errors.py)."""
    require_node()
    folder, X, y = _unrolled_package(tmp_path)
    for k in (2, 4, 8):
        path = folder / f"steps_{k}.onnx"
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    error = _train_node(tmp_path, "tampered", "node", {}, folder, X, y, [{**FIT, "epochs": 2000}], fails=True)
    assert error["name"] == "TrainingPackageError", error
    assert "does not match the manifest's checksum" in error["message"] and "steps_" in error["message"], error
