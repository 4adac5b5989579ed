"""Bad input to the JavaScript trainer (js/), each injected: a package of another format version, a file whose
checksum does not match, non-finite values in X or y, a label outside the classes, a sample weight the graph does
not take, rows of the wrong width, a training loss that overflows. Each raises an error naming what is wrong
(TrainingPackageError; TypeError or RangeError for a bad argument; ConvergenceError for a non-finite loss), and a
failed fit leaves the state as it was before the failing step. One node process (onnxruntime-node)
runs every case; the checks are the library's own code, the same on onnxruntime-web. A manifest or a state header
giving a key twice (JSON.parse keeps the last value) is refused as Python refuses it, in Node and in Chromium."""

from __future__ import annotations

import base64
import json
import shutil
from urllib.parse import quote

import numpy as np
import pytest

from bench.portable import PageServer, open_page
from ortflow.exceptions import TrainingPackageError
from ortflow.package import TrainingPackage, load_training_state, train_package

from js_support import (CHROMIUM, JS_GROUP, assert_named, make_package, node, require_node, state_file, state_parts,
                        weights_atol)

pytestmark = JS_GROUP

SCRIPT = """
import {createRequire} from 'node:module';
import {Trainer} from './node.js';
const ort = createRequire(import.meta.url)('onnxruntime-node');
const [linear, binary, versioned, tampered, tamperedUnrolled] = %s;
const rows = (n, w, f) => Array.from({length: n}, (_, i) => Array.from({length: w}, (_, j) => f(i, j)));
const X = rows(60, 5, (i, j) => ((i * 7 + j * 3) %% 11) / 10 - 0.5);
const y = X.map((r) => r[0] - r[1]);
const labels = Array.from({length: 60}, (_, i) => (i %% 3 ? 'yes' : 'no'));
const Xb = rows(60, 6, (i, j) => ((i + j) %% 5) / 5);
const out = {};
async function expectError(name, f) {
  try { await f(); out[name] = {thrown: false}; }
  catch (e) { out[name] = {thrown: true, name: e.name, message: e.message, epoch: e.epoch, step: e.step}; }
}
await expectError('version', () => Trainer.load(versioned, {ort}));
await expectError('checksum', () => Trainer.load(tampered, {ort}));
await expectError('no_runtime', () => Trainer.load(linear, {}));
// an unrolled graph is read when a fit first runs it: its checksum is checked then
const u = await Trainer.load(tamperedUnrolled, {ort, unrolled: true});
await expectError('checksum_unrolled', () => u.fit(X, y, {shuffle: false}));
out.after_checksum_unrolled = {steps: u.steps, runs: u.runs};
const t = await Trainer.load(linear, {ort, unrolled: true});  // the overflowing batches in one run of steps_2
await expectError('nan_x', () => t.fit(X.map((r, i) => (i === 3 ? [r[0], NaN, ...r.slice(2)] : r)), y));
await expectError('inf_y', () => t.fit(X, y.map((v, i) => (i === 7 ? Infinity : v))));
await expectError('width', () => t.fit(X.map((r) => r.slice(1)), y));
await expectError('rows', () => t.fit(X, y.slice(1)));
await expectError('sample_weight', () => t.fit(X, y, {sampleWeight: y.map(() => 1)}));
await expectError('text_x', () => t.fit(X.map((r, i) => (i === 2 ? ['a', ...r.slice(1)] : r)), y));
await expectError('seed', () => t.fit(X, y, {seed: -1}));
await expectError('loss', () => t.fit(X.map((r, i) => (i < 20 ? r : r.map(() => 1e20))), y, {shuffle: false}));
out.after_loss = {steps: t.steps, epochs: t.epochs, tensors: Object.fromEntries(Object.entries(t.tensors).map(
  ([k, v]) => [k, Array.from(v)]))};
const b = await Trainer.load(binary, {ort});
await expectError('label', () => b.fit(Xb, labels.map((v, i) => (i === 5 ? 'maybe' : v))));
await expectError('label_type', () => b.fit(Xb, labels.map((v) => (v === 'yes' ? 1 : 0))));
console.log(JSON.stringify(out));
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    require_node()
    root = tmp_path_factory.mktemp("js_errors")
    linear, _, _ = make_package("linear", "sgd", root / "linear")
    binary, _, _ = make_package("binary", "adam", root / "binary")
    versioned = shutil.copytree(linear, root / "versioned")
    manifest = json.loads((versioned / "manifest.json").read_text())
    manifest["format_version"] = 2
    (versioned / "manifest.json").write_text(json.dumps(manifest))
    tampered = shutil.copytree(linear, root / "tampered")
    data = bytearray((tampered / "state.bin").read_bytes())
    data[0] ^= 1  # one bit of the first weight
    (tampered / "state.bin").write_bytes(bytes(data))
    tampered_unrolled = shutil.copytree(linear, root / "tampered_unrolled")
    data = bytearray((tampered_unrolled / "steps_2.onnx").read_bytes())
    data[-1] ^= 1
    (tampered_unrolled / "steps_2.onnx").write_bytes(bytes(data))
    paths = json.dumps([str(p) for p in (linear, binary, versioned, tampered, tampered_unrolled)])
    return {"linear": linear, **json.loads(node("--input-type=module", "-e", SCRIPT % paths).stdout)}


@pytest.mark.parametrize("case, error, words", [
    ("version", "TrainingPackageError", ["format", "version 2", "reads", "version 1"]),
    ("checksum", "TrainingPackageError", ["state.bin", "does not match the manifest's checksum"]),
    ("checksum_unrolled", "TrainingPackageError", ["steps_2.onnx", "does not match the manifest's checksum"]),
    ("no_runtime", "TypeError", ["Trainer.load needs {ort}"]),
    ("nan_x", "TrainingPackageError", ["X holds a non-finite value (NaN) at row 3, column 1"]),
    ("inf_y", "TrainingPackageError", ["y holds a non-finite value (Infinity) at row 7"]),
    ("width", "TrainingPackageError", ["X has 240 values in 60 rows", "rows of 5 values"]),
    ("rows", "TrainingPackageError", ["y has 59 rows, X has 60"]),
    ("sample_weight", "TrainingPackageError", ["sampleWeight was given but the package's graph has no weight input"]),
    ("text_x", "TrainingPackageError", ['X holds "a" at value 10 (row 2)', "float32 numbers"]),
    ("seed", "RangeError", ["seed=-1 must be an unsigned 32-bit integer"]),
    ("loss", "ConvergenceError", ["the training loss is Infinity at epoch 1, step 2 (batch 2)"]),
    ("label", "TrainingPackageError", ['y holds the label "maybe" (row 5)', 'classes ["no","yes"]']),
    ("label_type", "TrainingPackageError", ["y holds the label 0 (row 0)", 'classes ["no","yes"]']),
])
def test_bad_input_is_named(outcomes, case, error, words):
    assert_named(outcomes[case], error, words)


def test_failed_step_keeps_the_state_before_it(outcomes):
    """The overflowing batch (the second) is not applied: one step done, the state the one the reference loop
    reaches after the first batch (the same rows, unshuffled). The two batches lie in one run of steps_2.onnx:
    its non-finite loss sends the library back to single steps from the run's start."""
    assert 2 in [u["steps"] for u in TrainingPackage(outcomes["linear"]).manifest["unrolled"]]
    after = outcomes["after_loss"]
    assert (after["steps"], after["epochs"]) == (1, 0)
    assert (outcomes["loss"]["epoch"], outcomes["loss"]["step"]) == (1, 2)
    i, j = np.mgrid[0:16, 0:5]
    exact = ((i * 7 + j * 3) % 11) / 10 - 0.5  # as the script computes them, in double precision
    X, y = exact.astype(np.float32), (exact[:, 0] - exact[:, 1]).astype(np.float32)
    reference = train_package(outcomes["linear"], X, y, epochs=1, shuffle=False)
    assert reference.steps == 1
    initial = TrainingPackage(outcomes["linear"]).initial_state()
    for name, expected in reference.tensors.items():
        got = np.asarray(after["tensors"][name], np.float32).reshape(expected.shape)
        np.testing.assert_allclose(got, expected, rtol=0, atol=weights_atol(1, expected), err_msg=name)
        assert not np.array_equal(expected, initial.tensors[name]), name


def test_an_unrolled_graph_is_checked_when_first_read(outcomes):
    """Trainer.load reads no unrolled graph: a package whose steps_2.onnx was altered loads, and the fit that first
    runs it (``unrolled: true``) stops before any step with the checksum error (test_bad_input_is_named)."""
    assert outcomes["after_checksum_unrolled"] == {"steps": 0, "runs": 0}


# --- a key given twice: JSON.parse keeps the last value, Python's reader refuses the file -------------------------
@pytest.fixture(scope="module")
def twice(tmp_path_factory):
    """pkgs/good, pkgs/manifest (optimizer.params gives eta0 twice, the last one 50 times larger), a state of the
    good package whose header gives rows twice; Python refuses both."""
    require_node()
    pkgs = tmp_path_factory.mktemp("js_twice")
    good, _, _ = make_package("linear", "sgd", pkgs / "good")
    manifest = json.loads((good / "manifest.json").read_text())
    eta0 = manifest["optimizer"]["params"]["eta0"]
    manifest["optimizer"]["params"]["__again__"] = None
    bad = shutil.copytree(good, pkgs / "manifest")
    (bad / "manifest.json").write_text(json.dumps(manifest).replace('"__again__": null', f'"eta0": {50 * eta0}'))
    state = TrainingPackage(good).initial_state().to_bytes()
    header, body = state_parts(state)
    state_twice = state_file(header, body, json.dumps(header)[:-1] + ', "rows": 7}')
    with pytest.raises(TrainingPackageError, match=r"the key 'eta0' is given twice"):
        TrainingPackage(bad)
    with pytest.raises(TrainingPackageError, match=r"header: the key 'rows' is given twice"):
        load_training_state(good, state_twice)
    encode = lambda data: base64.b64encode(data).decode()  # noqa: E731
    return {"pkgs": pkgs, "cases": {"good": {"package": "good", "state": encode(state)}, "manifest": "manifest",
                                    "state": {"package": "good", "state": encode(state_twice)}}}


@pytest.mark.parametrize("runtime", ["node", "chromium"])
def test_a_key_given_twice_is_refused(twice, runtime):
    def located(base: str) -> dict:
        return {name: base + case if isinstance(case, str) else {**case, "package": base + case["package"]}
                for name, case in twice["cases"].items()}

    if runtime == "node":
        outcomes = json.loads(node("test/load-cases.mjs", "node", json.dumps(located(f"{twice['pkgs']}/"))).stdout)
    else:
        if CHROMIUM is None:
            pytest.fail("chromium is not installed: `make chromium` installs Debian's package")
        with PageServer({"/pkgs/": twice["pkgs"]}) as server:
            cases = quote(json.dumps(located(f"{server.url}/pkgs/")))
            outcomes = open_page(f"{server.url}/js/test/load-cases.html?cases={cases}", timeout=120)["outcomes"]
    assert outcomes["good"]["loaded"], outcomes["good"]
    for case, words in (("manifest", ["manifest.json of the package", "the key 'eta0' is given twice (in "
                                      "optimizer.params)"]),
                        ("state", ["the state given to loadState's header: the key 'rows' is given twice"])):
        assert_named({"thrown": not outcomes[case]["loaded"], **outcomes[case]}, "TrainingPackageError", words)
