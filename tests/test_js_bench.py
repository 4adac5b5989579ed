"""``python -m bench.portable`` on tiny sizes (Python, onnxruntime-node, WebAssembly in Node; the page it opens in
Chromium is tests/test_js_browser.py's): the report's structure, and every engine trained the same batches: the last
epoch's mean loss agrees with Python's within twice the weights' rule of tests/js_support.py (a squared error doubles
a relative error) plus the float32 rounding of the mean over the epoch's rows. No timing is asserted."""

from __future__ import annotations

import json

import numpy as np

from bench import portable

from js_support import JS_GROUP, require_node
from tolerances import TERM_ROUNDINGS, U32

pytestmark = JS_GROUP


def test_portable_bench_runs_every_engine_on_the_same_batches(tmp_path):
    require_node()
    out = tmp_path / "portable.json"
    assert portable.main(["--engines", "python,node,wasm", "--repeats", "1", "--rows-wide", "512", "--epochs-a", "2",
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
