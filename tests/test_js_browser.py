"""The browser example (examples/browser/index.html) in headless Chromium: the page, served on 127.0.0.1 by a
Python http.server thread (bench.portable.PageServer), trains a package with onnxruntime-web (WebAssembly, one
thread) and POSTs the state back; Python's load_training_state of it holds the weights the reference loop reaches on
the same batches (the rule of tests/js_support.py) and its trained graph predicts like the Python-trained graph
(``output_atol``). The page reads only the files it uses (no unrolled graph ``steps_<K>.onnx`` for a fit too short to
pay for one), and a fit on the page's own thread lets the page's timers run: a timer stops it through its signal."""

from __future__ import annotations


import numpy as np
import pytest

from bench.portable import open_page
from ortflow.package import load_training_state, train_package

from js_support import JS_GROUP, output_atol, run_graph, served_example, weights_atol

pytestmark = JS_GROUP
FIT = {"epochs": 3, "seed": 11, "shuffle": True}
LONG_FIT = 2000


@pytest.fixture
def site(tmp_path):
    with served_example(tmp_path) as served:
        yield served


def test_chromium_trains_a_package_and_sends_the_state_back(site):
    query = (f"package=/package/&data=/input/data.json&epochs={FIT['epochs']}&seed={FIT['seed']}&shuffle=1"
             "&autorun=1&post=/state")
    page = open_page(f"{site['server'].url}/examples/browser/index.html?{query}", timeout=120)
    assert "epoch 3: loss" in page["log"] and len(page["times"]) == 3
    assert site["server"].posted is not None
    state = load_training_state(site["folder"], site["server"].posted)
    reference = train_package(site["folder"], site["X"], site["y"], **FIT)
    assert (state.epochs, state.steps, state.rows_seen) == (reference.epochs, reference.steps, reference.rows_seen)
    for name, expected in reference.tensors.items():
        np.testing.assert_allclose(state.tensors[name], expected, rtol=0,
                                   atol=weights_atol(reference.steps, expected), err_msg=name)
    ours = run_graph(state.trained_onnx_bytes(), site["X"])
    theirs = run_graph(reference.trained_onnx_bytes(), site["X"])
    atol = output_atol(reference, site["X"])
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, rtol=0, atol=atol, err_msg=name)
    losses = [e["loss"] for e in page["epochs"]]
    assert losses[-1] < losses[0]
    # a few steps per epoch: no unrolled graph pays for its creation, and none is downloaded
    read = {path.split("?")[0].rsplit("/", 1)[-1] for path in site["server"].requests if path.startswith("/package/")}
    assert read == {"manifest.json", "step_flat.onnx", "predict.onnx", "state.bin"}, read


def test_a_fit_on_the_pages_thread_lets_its_timers_run_and_stop_it(site):
    """Issue 47 item 3: fit yields to the event loop, so a page's 1 ms timer ticks while a fit of 2,000 epochs (8,000
    steps: seconds) runs on the same thread, and its first tick aborts the fit through its AbortSignal: the fit ends
    before its epochs only if the timer ran during it (before the fix it ran 0 times)."""
    query = f"package=/package/&data=/input/data.json&epochs={LONG_FIT}&stopAfterTicks=1"
    page = open_page(f"{site['server'].url}/js/test/main-thread.html?{query}", timeout=120)
    assert page["aborted"] and page["ticksDuringFit"] >= 1
    assert page["epochs"] < LONG_FIT
