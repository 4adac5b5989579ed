"""The Web Worker example (examples/browser/worker.html and worker.js) in headless Chromium: the worker trains a
package while the page's thread stays free. The page asks for a fit far longer than the test waits and presses Stop
from its own clock (a 10 ms timer on the page's thread), a few ticks after the first epoch arrived: the fit can only
end that early if the page's timer ran while the worker trained. The state the page then POSTs back holds the
weights Python's reference loop reaches in as many epochs (the rule of tests/js_support.py)."""

from __future__ import annotations


import numpy as np
import pytest

from bench.portable import open_page
from ortflow.package import load_training_state, train_package

from js_support import JS_GROUP, served_example, weights_atol

pytestmark = JS_GROUP
#: epochs asked for: far more than run before the page's Stop (each epoch of this package is a few steps)
EPOCHS = 100_000
TICKS = 5


def test_worker_trains_while_the_page_ticks_and_stops_on_the_pages_clock(tmp_path):
    with served_example(tmp_path) as site:
        server, folder, X, y = site["server"], site["folder"], site["X"], site["y"]
        query = (f"package=/package/&data=/input/data.json&epochs={EPOCHS}&seed=3&shuffle=1&autorun=1&post=/state"
                 f"&stopAfterTicks={TICKS}")
        page = open_page(f"{server.url}/examples/browser/worker.html?{query}", timeout=120)
        posted = server.posted
    assert page["stopped"] and page["ticksDuringFit"] >= TICKS
    epochs = len(page["history"]["epoch"])
    assert 1 <= epochs < EPOCHS
    assert [e["epoch"] for e in page["epochs"]] == list(range(1, epochs + 1))
    ticks = [e["ticks"] for e in page["epochs"]]
    assert ticks == sorted(ticks)
    # the state of the epochs trained, transferred from the worker and POSTed by the page
    state = load_training_state(folder, posted)
    reference = train_package(folder, X, y, epochs=epochs, seed=3, shuffle=True)
    assert (state.epochs, state.steps, state.rows_seen) == (reference.epochs, reference.steps, reference.rows_seen)
    for name, expected in reference.tensors.items():
        np.testing.assert_allclose(state.tensors[name], expected, rtol=0,
                                   atol=weights_atol(reference.steps, expected), err_msg=name)
