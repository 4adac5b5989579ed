"""The training-package format defined once (ortflow/package/format.py): the generated JSON Schema committed under
js/src/, a real package's manifest read as records and written back unchanged, and malformed manifests and state
files refused by Python and by JavaScript (js/src/format.js) with an error naming the field (issue 45 items 1-3 and
the state header's weak results)."""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
import tracemalloc

import numpy as np
import onnx
import pytest

import ortflow
from ortflow import OrtGradientOptimizer, TrainingPackageError
from ortflow.package import (MANIFEST, PREDICT_FILE, STATE_FILE, Manifest, TrainingPackage, average_states,
                             load_training_state)
from ortflow.package import format as fmt
from js_support import JS_GROUP, case_data, node, require_node, state_file, state_parts


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """A package with optimizer slots (Adam) and an unrolled graph: (folder, manifest JSON)."""
    onx, X, y, _ = case_data("linear")
    folder = tmp_path_factory.mktemp("fmt") / "pkg"
    ortflow.export_training_package(OrtGradientOptimizer(onx, batch_size=16, learning_rate="adam"), folder,
                                    max_unrolled=2)
    return folder, json.loads((folder / MANIFEST).read_text())


# --- one definition -------------------------------------------------------------------------------------------
def test_the_committed_schema_is_the_generated_one():
    stale = [str(p) for p, text in fmt.generated().items() if not p.is_file() or p.read_text() != text]
    assert not stale, f"{stale} differ from ortflow/package/format.py: run python -m ortflow.package.format --write"


def test_a_real_manifest_round_trips_through_the_records(package):
    folder, manifest = package
    record = Manifest.from_json(manifest)
    assert record.to_json() == manifest
    assert Manifest.from_json(record.to_json()) == record
    assert record.state.tensors[2].name == "coef_m" or record.optimizer.slots
    # every graph input has its role: the readers find inputs by it
    assert all(s.role for e in (record.step, record.step_flat, *record.unrolled, record.predict) for s in e.inputs)
    assert [s.name for s in fmt.inputs_by_role(record.step_flat, "state")] == [record.step_flat.state_input]


def test_a_manifest_says_what_wrote_it(package):
    """``created_with``: this ortflow's version, the onnxruntime build that wrote the package and onnx's version;
    a package from before the field reads (it is optional)."""
    import importlib.metadata

    from ortflow._ort import runtime_name

    _, manifest = package
    assert manifest["created_with"] == {"ortflow": importlib.metadata.version("ortflow"),
                                        "onnxruntime": runtime_name(), "onnx": onnx.__version__}
    older = {k: v for k, v in manifest.items() if k != "created_with"}
    assert Manifest.from_json(older).created_with is None


def test_a_manifest_without_the_newer_roles_still_reads(package):
    """Packages written before every graph input carried its role: the readers derive the roles."""
    _, manifest = package
    old = copy.deepcopy(manifest)
    for entry in (old["step_flat"], *old["unrolled"], old["predict"]):
        for spec in (*entry["inputs"], *entry["outputs"]):
            del spec["role"]
    for spec in old["step"]["outputs"]:
        del spec["role"]
    assert Manifest.from_json(old).to_json() == manifest


# --- malformed manifests: (what, change, the field the error names) -------------------------------------------
def _set(path: str, value):
    def change(m):
        *parents, last = _parse(path)
        target = m
        for part in parents:
            target = target[part]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value(target[last]) if callable(value) else value
    return change


def _parse(path: str) -> list:
    """``a.b[1]['c.d']`` -> ``["a", "b", 1, "c.d"]``."""
    return [key if key else int(index) if index else name
            for key, index, name in re.findall(r"\['([^']*)'\]|\[(\d+)\]|\.?(\w+)", path)]


_DELETE = object()
NAN = float("nan")

#: (case, change, the field named, JavaScript too): every one of them was used before its structure was checked
FAULTS = [
    ("wrong type", _set("batch_size", "16"), "batch_size", True),
    ("bool as count", _set("batch_size", True), "batch_size", True),
    ("null offset", _set("state.tensors[1].offset", None), "state.tensors[1].offset", True),
    ("NaN offset", _set("state.tensors[0].offset", NAN), "state.tensors[0].offset", True),
    ("string offset", _set("state.tensors[0].offset", "0"), "state.tensors[0].offset", True),
    ("negative shape", _set("state.tensors[0].shape[0]", -5), "state.tensors[0].shape[0]", True),
    ("shape over 2**53", _set("state.tensors[0].shape[0]", 2 ** 64), "state.tensors[0].shape[0]", True),
    # np.prod([2**32, 2**32], dtype=int64) wraps to 0
    ("overflowing shape", _set("state.tensors[0].shape", [2 ** 32, 2 ** 32]), "state.tensors[0].length", True),
    ("lying length", _set("state.tensors[0].length", lambda n: n + 1), "state.tensors[0].length", True),
    ("gap in the state", _set("state.tensors[1].offset", lambda n: n + 4), "state.tensors[1].offset", True),
    ("state bytes", _set("state.bytes", lambda n: n + 4), "state.bytes", True),
    ("shape against the step", _set("step.inputs[2].shape", [6, 1]), "step.inputs[2].shape", True),
    ("flat state size", _set("step_flat.inputs[2].shape", [3]), "step_flat.inputs[2].shape", True),
    ("unrolled rows", _set("unrolled[0].rows", 31), "unrolled[0].rows", True),
    ("patch past predict.onnx", _set("predict.weights[1].offset", 10 ** 6), "predict.weights[1].offset",
     True),
    ("patch of other bytes", _set("predict.weights[0].bytes", lambda n: n + 4), "predict.weights[0].bytes", True),
    ("patch shape", _set("predict.weights[0].shape", [1, 5]), "predict.weights[0].shape", True),
    ("null name", _set("target.name", None), "target.name", True),
    ("missing field", _set("schedule.eta0", _DELETE), "schedule.eta0", True),
    ("NaN rate", _set("schedule.eta0", NAN), "schedule.eta0", True),
    ("unknown field", _set("state.ofset", 0), "state.ofset", True),
    ("version true", _set("format_version", True), "format_version", True),
    ("unlisted file", _set(f"files['{PREDICT_FILE}']", _DELETE), "predict.file", True),
    ("file outside", _set("files['../secret.bin']", {"sha256": "0" * 64, "bytes": 1}), "files['../secret.bin']",
     True),
    # consistent with itself, not with step.onnx: only the graph tells (Python reads the graphs)
    ("graph shape", lambda m: [s.__setitem__("shape", ["batch", 6]) for s in (m["step"]["inputs"][0],
                                                                            m["data_inputs"][0])],
     "step.inputs[0].shape", False),
    ("graph dtype", _set("step.inputs[1].dtype", "float64"), "step.inputs[1].dtype", False),
]


@pytest.mark.parametrize("case, change, field, _", FAULTS, ids=[f[0] for f in FAULTS])
def test_a_malformed_manifest_is_refused_naming_the_field(package, tmp_path, case, change, field, _):
    folder, manifest = package
    bad = copy.deepcopy(manifest)
    change(bad)
    copy_ = tmp_path / "pkg"
    shutil.copytree(folder, copy_)
    (copy_ / MANIFEST).write_text(json.dumps(bad))  # the files' checksums stay valid
    with pytest.raises(TrainingPackageError) as error:
        TrainingPackage(copy_)
    assert f"{field}:" in str(error.value) or f"{field} " in str(error.value), str(error.value)
    assert str(copy_ / MANIFEST) in str(error.value) or case == "unlisted file"


def test_a_lying_patch_never_gives_corrupt_bytes(package, tmp_path):
    """Issue 45 item 2: with valid checksums, a patch past predict.onnx's end made trained_onnx_bytes() return a
    longer, corrupt graph; the package is refused when read, before any byte is patched."""
    folder, manifest = package
    bad = copy.deepcopy(manifest)
    size = manifest["files"][PREDICT_FILE]["bytes"]
    patch = bad["predict"]["weights"][-1]
    patch["offset"] = size - patch["bytes"] // 2
    shutil.copytree(folder, tmp_path / "pkg")
    (tmp_path / "pkg" / MANIFEST).write_text(json.dumps(bad))
    with pytest.raises(TrainingPackageError, match=r"predict\.weights\[1\]\.offset: .* lie outside 'predict.onnx'"):
        TrainingPackage(tmp_path / "pkg").initial_state().trained_onnx_bytes()
    assert len(TrainingPackage(folder).initial_state().trained_onnx_bytes()) == size


# --- state files ----------------------------------------------------------------------------------------------
def _state_faults(good: bytes) -> list[tuple[str, bytes, str]]:
    header, body = state_parts(good)
    faults = []

    def changed(what, change, message):
        h = copy.deepcopy(header)
        change(h)
        faults.append((what, state_file(h, body), message))

    first = header["tensors"][0]
    changed("duplicate tensor", lambda h: h["tensors"].insert(1, dict(first)),
            r"tensors\[1\]\.name: .coef. is listed twice")
    faults.append(("trailing bytes", good + b"\0" * 4, r"\(trailing bytes\)"))
    changed("string offset", lambda h: h["tensors"][0].__setitem__("offset", "0"), r"tensors\[0\]\.offset:")
    changed("version true", lambda h: h.__setitem__("format_version", True), "format_version:")
    changed("huge rows", lambda h: h.__setitem__("rows", 2 ** 53), "rows:")
    changed("negative steps", lambda h: h.__setitem__("steps", -1), "steps:")
    faults.append(("wrong magic", b"PK\x03\x04" + good[4:], "not an ortflow training state"))
    changed("other package", lambda h: h.__setitem__("package_id", "0" * 64), "trained from another package")
    changed("other shape", lambda h: h["tensors"][0].__setitem__("shape", [1, 5]), r"other shapes \[.coef: ")
    faults.append(("NaN value", state_file(header, np.float32(np.nan).tobytes() + body[4:]),
                   "tensor .coef. holds 1 non-finite value"))
    huge = re.sub(r'"rows": \d+', '"rows": 1' + "0" * 400, json.dumps(header))
    faults.append(("rows 10**400", state_file(header, body, huge), "rows:"))
    # JSON.parse keeps the last value: JavaScript scans the text for it
    faults.append(("key given twice", state_file(header, body, json.dumps(header)[:-1] + ', "rows": 7}'),
                   "header: the key 'rows' is given twice"))
    return faults


def test_a_malformed_state_header_is_refused_naming_the_field(package):
    folder, _ = package
    good = TrainingPackage(folder).initial_state().to_bytes()
    for what, data, message in _state_faults(good):
        with pytest.raises(TrainingPackageError) as error:
            load_training_state(folder, data)
        assert re.search(message, str(error.value)), (what, str(error.value))


def test_a_huge_state_file_is_refused_from_its_header(package, tmp_path):
    """A 1 GiB file (sparse: no disk used) is refused from its first bytes, never read whole."""
    folder, _ = package
    good = TrainingPackage(folder).initial_state().to_bytes()
    cases = {"trailing.state": (good, "(trailing bytes)"), "other.state": (b"PK\x03\x04" + good[4:],
                                                                          "not an ortflow training state")}
    for name, (start, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(start)
        with open(path, "r+b") as f:
            f.truncate(1 << 30)
        tracemalloc.start()
        try:
            with pytest.raises(TrainingPackageError, match=message):
                load_training_state(folder, path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 64 << 20, f"{name}: {peak} bytes were allocated to refuse it"


def test_average_states_bounds_rows(package):
    """Issue 45 item 3: rows=10**400 or two states of 10**308 rows raised OverflowError."""
    folder, _ = package
    state = TrainingPackage(folder).initial_state()
    for rows in ([10 ** 400], [10 ** 308, 10 ** 308], [2 ** 52, 2 ** 52]):
        states = [copy.copy(state) for _ in rows]
        for s, r in zip(states, rows):
            s.rows = r
        with pytest.raises(TrainingPackageError, match=r"rows.*2\*\*53"):
            average_states(states)
    a, b = copy.copy(state), copy.copy(state)
    a.rows, b.rows = 2 ** 52, 2 ** 52 - 1
    a.tensors = {k: np.ones_like(v) for k, v in state.tensors.items()}
    b.tensors = {k: np.zeros_like(v) for k, v in state.tensors.items()}
    mean = average_states([a, b])
    assert mean.rows == 2 ** 53 - 1
    np.testing.assert_allclose(mean.tensors["coef"], 2 ** 52 / (2 ** 53 - 1), rtol=1e-7)


# --- the same in JavaScript -----------------------------------------------------------------------------------
def _js_numbers(value):
    """NaN and infinities as {"$number": ...} (JSON cannot hold them; test/format.mjs revives them)."""
    if isinstance(value, float) and not np.isfinite(value):
        return {"$number": "NaN" if np.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}
    if isinstance(value, list):
        return [_js_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _js_numbers(v) for k, v in value.items()}
    return value


@JS_GROUP
def test_javascript_refuses_the_same_manifests_and_states(package, tmp_path):
    require_node()
    folder, manifest = package
    state = TrainingPackage(folder).initial_state()
    state.epochs, state.steps, state.rows_seen, state.rows = 3, 12, 180, 60
    good = state.to_bytes()
    manifests = []
    for _, change, _, _ in FAULTS:
        bad = copy.deepcopy(manifest)
        change(bad)
        manifests.append(_js_numbers(bad))
    faults = _state_faults(good)
    vector = np.frombuffer((folder / STATE_FILE).read_bytes(), "<f4")
    cases = {"manifest": manifest, "manifests": manifests,
             "states": [base64.b64encode(d).decode() for _, d, _ in faults],
             "good_state": base64.b64encode(good).decode(),
             "state": [float(v) for v in vector], "progress": {"epochs": 3, "steps": 12, "rowsSeen": 180, "rows": 60}}
    wrong = copy.deepcopy(manifest)
    wrong["step"]["inputs"][0]["shape"] = ["batch", 6]
    wrong["step_flat"]["inputs"][1]["dtype"] = "float64"
    renamed = copy.deepcopy(manifest["predict"])
    renamed["outputs"][0]["name"] = "other"
    cases["graphs"] = [
        {"file": str(folder / e["file"]), "entry": e, "path": p}
        for p, e in [("step", manifest["step"]), ("step_flat", manifest["step_flat"]), ("unrolled[0]",
                     manifest["unrolled"][0]), ("predict", manifest["predict"]), ("step", wrong["step"]),
                     ("step_flat", wrong["step_flat"]), ("predict", renamed)]]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    node("test/format.mjs", tmp_path / "cases.json", tmp_path / "out.json")
    out = json.loads((tmp_path / "out.json").read_text())
    for (case, _, field, in_js), message in zip(FAULTS, out["manifests"]):
        if in_js:
            assert message is not None and message.startswith("manifest.json: ") and f"{field}:" in message, \
                (case, message)
    for (what, _, expected), message in zip(faults, out["states"]):
        assert message is not None and re.search(expected, message), (what, message)
    assert out["graphs"][:4] == [None] * 4, out["graphs"]
    for message, field in zip(out["graphs"][4:], ["step.inputs[0].shape:", "step_flat.inputs[1].dtype:",
                                                  "predict.outputs:"]):
        assert message is not None and message.startswith("manifest.json: ") and field in message, message
    assert out["constants"] == {"FORMAT": fmt.FORMAT, "FORMAT_VERSION": fmt.FORMAT_VERSION,
                                "STATE_FORMAT": fmt.STATE_FORMAT, "GENERATOR": fmt.GENERATOR}
    assert out["roles"]["state"] == ["state"] and out["roles"]["learning_rate"] == ["learning_rate"]
    # the codec: Python's state file decoded, and JavaScript's encoding the same bytes as Python's
    np.testing.assert_array_equal(np.array(out["decoded"]["state"], np.float32), vector)
    assert out["decoded"]["progress"] == {"epochs": 3, "steps": 12, "rowsSeen": 180, "rows": 60}
    assert base64.b64decode(out["encoded"]) == good and out["encodedOwnBuffer"]
