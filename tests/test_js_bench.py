"""``python -m bench.portable`` on tiny sizes (Python, onnxruntime-node, WebAssembly in Node; the page it opens in
Chromium is tests/test_js_browser.py's): the report's structure, and every engine trained the same batches: the last
epoch's mean loss agrees with Python's within twice the weights' rule of tests/js_support.py (a squared error doubles
a relative error) plus the float32 rounding of the mean over the epoch's rows. The comparison with TensorFlow.js
(``--suite tfjs``) on its Node engines and the first-use pages in Chromium: the report's structure (TF.js's Adam puts
its epsilon elsewhere, so its losses are reported, not compared). No timing is asserted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import portable

from js_support import JS_GROUP, require_node
from tolerances import TERM_ROUNDINGS, U32

pytestmark = JS_GROUP


def test_portable_bench_runs_every_engine_on_the_same_batches(tmp_path):
    require_node()
    out = tmp_path / "portable.json"
    assert portable.main(["--suite", "portable", "--engines", "python,node,wasm", "--repeats", "1", "--rows-wide", "512", "--epochs-a", "2",
                          "--epochs-wide", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["case"]["key"] for r in report["results"]] == ["A", "D-wide"]
    assert report["threads"]["node"] == "intraOpNumThreads=1"
    assert report["machine"]["versions"]["onnxruntime-node"] == "1.30.0"
    for result in report["results"]:
        case = result["case"]
        # the default bound of the unrolled graphs: A's 30 µs step up to 32 steps, D-wide's 1.4 ms up to 4
        assert result["unrolled"] == {"A": [2, 4, 8, 16, 32], "D-wide": [2, 4]}[case["key"]]
        steps = case["epochs"] * -(-case["n_train"] // case["batch_size"])
        rtol = 2 * (2 * steps * TERM_ROUNDINGS * U32) + case["n_train"] * U32
        python = result["engines"]["python"]["last_loss"]
        for name in ("node", "wasm"):
            entry = result["engines"][name]
            assert entry["epoch_s"] > 0 and len(entry["repeats_s"]) == 1 and entry["epoch_cpu_s"] > 0
            np.testing.assert_allclose(entry["last_loss"], python, rtol=rtol, err_msg=f"{case['key']} {name}")
        assert set(result["paired_ratio_to_python"]) == {"python", "node", "wasm"}


def test_portable_bench_against_tfjs_reports_first_use_and_steady_epochs(tmp_path):
    require_node()
    if not (portable.JS / "node_modules" / "@tensorflow" / "tfjs").is_dir():
        pytest.skip("js/node_modules has no @tensorflow/tfjs (a devDependency): run `npm ci` in js/")
    if portable.chromium_path() is None:
        pytest.fail("chromium is not installed: `make chromium` installs Debian's package")
    out = tmp_path / "portable.json"
    assert portable.main(["--suite", "tfjs", "--tfjs-cases", "mlp-small", "--tfjs-engines",
                          "node,tfjs-node,chromium,tfjs-chromium", "--repeats", "1", "--tfjs-rows", "64",
                          "--tfjs-epochs", "2", "--tfjs-more", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["results"] == [] and report["machine"]["versions"]["@tensorflow/tfjs"] == "4.22.0"
    (result,) = report["tfjs"]
    assert result["case"]["rows"] == 64 and len(result["load_average"]) == 1
    for name in ("chromium", "tfjs-chromium"):
        entry = result["engines"][name]
        assert entry["first_use_s"] > 0 and entry["threads"] == 1 and not entry["isolated"]
    assert result["engines"]["node"]["first_use_s"] is None
    assert set(result["ratios"]) == {"node", "chromium"} and set(result["ratios"]["chromium"]) == {"epoch", "first_use"}
    for entry in result["engines"].values():
        assert entry["epoch_s"] > 0 and np.isfinite(entry["last_loss"])
