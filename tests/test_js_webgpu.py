"""Issue 47 item 7: WebGPU where the browser has it. Headless Chromium with ``--enable-unsafe-webgpu`` gives a
software adapter (SwiftShader) where there is no GPU; onnxruntime-web's two WebGPU builds (``ort.webgpu.min.mjs``:
the native WebGPU execution provider; ``ort.all.min.mjs``: JSEP) train a small MLP with Adam (a 12-tensor state) a
few steps with ``executionProviders: ['webgpu', 'wasm']`` (js/test/webgpu.html) on the per-tensor, flat and unrolled
graphs, to the weights the wasm provider reaches (the rule of tests/js_support.py: a GPU sums in another order), with
every node on the device (onnxruntime warns when a node falls back to the CPU). A device failure stops the fit with
an ExecutionProviderError naming the providers: a package built without the storage-buffer bound (its 13-tensor
Split/Concat: the native build throws, JSEP reports validation errors and returns zeros), and a step graph that
gives an all-zero state. On SwiftShader WebGPU is far slower than wasm: the data is tiny, and nothing is timed.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ortflow
from bench.portable import PageServer, open_page
from ortflow.package import FLAT_STEP_FILE, load_training_state
from ortflow.package import graphs, writer
from ortflow.package.folder import sha256_bytes

from js_support import CHROMIUM, JS_GROUP, case_data, optimizer, require_node, state_atol

pytestmark = JS_GROUP
BUILDS = ("ort.webgpu.min.mjs", "ort.all.min.mjs")
LAYOUTS = ("tensors", "flat", "unrolled")
FELL_BACK = "Some nodes were not assigned to the preferred execution providers"


def _export(folder, **kwargs):
    model, X, y, _ = case_data("mlp")
    est = ortflow.OrtGradientOptimizer(model, learning_rate=optimizer("adam"), batch_size=4)
    ortflow.export_training_package(est, folder, max_unrolled=2, **kwargs)
    return X[:12], y[:12]  # 3 steps: a run of steps_2.onnx and a single step when unrolled


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    require_node()
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: `make chromium` installs Debian's package")
    root = tmp_path_factory.mktemp("webgpu")
    X, y = _export(root / "good")
    with pytest.MonkeyPatch.context() as patch:  # the graphs as they were before the bound: 13-tensor nodes
        for module in (graphs, writer):
            patch.setattr(module, "within_buffers", lambda model, limit=8: model)
        _export(root / "wide")
    zeroing = _zeroing_copy(root / "good", root / "zeroing")
    (root / "data.json").write_text(json.dumps({"X": X.tolist(), "y": y.tolist()}))
    with PageServer({"/pkgs/": root}) as server:
        yield {"server": server, "root": root, "zeroing": zeroing}


def _zeroing_copy(good, dest):
    """A copy of ``good`` whose step_flat.onnx gives the updated state times 0: what a failed device returns."""
    import shutil

    shutil.copytree(good, dest)
    path = dest / FLAT_STEP_FILE
    model = onnx.load(path)
    out = model.graph.output[1].name
    for node in model.graph.node:
        node.output[:] = [f"{o}/raw" if o == out else o for o in node.output]
    model.graph.initializer.append(helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]))
    model.graph.node.append(helper.make_node("Mul", [f"{out}/raw", "zero"], [out]))
    path.write_bytes(model.SerializeToString())
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest["files"][FLAT_STEP_FILE] = {"sha256": sha256_bytes(path.read_bytes()), "bytes": path.stat().st_size}
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


def _page(site, package: str, build: str, layouts, providers=("webgpu", "wasm")) -> dict:
    query = (f"package=/pkgs/{package}/&data=/pkgs/data.json&build={build}&layouts={','.join(layouts)}"
             f"&providers={','.join(providers)}")
    page = open_page(f"{site['server'].url}/js/test/webgpu.html?{query}", timeout=300,
                     flags=["--enable-unsafe-webgpu"])
    if "skipped" in page:
        pytest.skip(f"no WebGPU in this headless Chromium ({page['skipped']}; it needs --enable-unsafe-webgpu and "
                    "a GPU or its software adapter, SwiftShader)")
    return page


@pytest.mark.parametrize("build", BUILDS)
def test_webgpu_trains_to_the_wasm_state(site, build):
    page = _page(site, "good", build, LAYOUTS)
    runs = page["runs"]
    assert not [e for e in page["consoleErrors"] if FELL_BACK in e or "WebGPU" in e or "Removing initializer" in e], \
        page["consoleErrors"]
    for layout in LAYOUTS:
        gpu, cpu = runs[f"{layout}/webgpu"], runs[f"{layout}/wasm"]
        assert "error" not in gpu and "error" not in cpu, (layout, gpu.get("error"), cpu.get("error"))
        assert gpu["runs"] == cpu["runs"] == (2 if layout == "unrolled" else 3)
        ours = load_training_state(site["root"] / "good", base64.b64decode(gpu["state"]))
        reference = load_training_state(site["root"] / "good", base64.b64decode(cpu["state"]))
        assert ours.steps == reference.steps == 3
        for name, expected in reference.weights.items():  # the slots feed the next steps' weights
            np.testing.assert_allclose(ours.weights[name], expected, rtol=0, atol=state_atol(reference, name),
                                       err_msg=f"{layout}: {name}")
        assert all(np.isfinite(v).all() and np.abs(v).max() > 0 for v in ours.tensors.values())
        assert np.isfinite(gpu["losses"]).all() and gpu["losses"][0] > 0


@pytest.mark.parametrize("build", BUILDS)
def test_a_device_failure_stops_the_fit_naming_the_provider(site, build):
    """Without the bound the native build's run throws and JSEP's returns zeros (with device errors): both stop the
    fit with an ExecutionProviderError naming webgpu; wasm trains the same package."""
    page = _page(site, "wide", build, ("flat", "unrolled"))
    for layout in ("flat", "unrolled"):
        error = page["runs"][f"{layout}/webgpu"].get("error")
        assert error and error["name"] == "ExecutionProviderError", (layout, page["runs"][f"{layout}/webgpu"])
        assert '["webgpu","wasm"]' in error["message"], error
        assert "error" not in page["runs"][f"{layout}/wasm"]
    assert "storage buffers" in page["runs"]["flat/webgpu"]["error"]["message"]  # the first failure's cause


def test_an_all_zero_state_from_a_device_is_refused(site):
    page = _page(site, "zeroing", BUILDS[1], ("flat",))
    error = page["runs"]["flat/webgpu"].get("error")
    assert error and error["name"] == "ExecutionProviderError", page["runs"]
    assert "all-zero state from a non-zero one" in error["message"] and '["webgpu","wasm"]' in error["message"]
    assert "error" not in page["runs"]["flat/wasm"]  # on the CPU the check is off: it trains (to zeros)
