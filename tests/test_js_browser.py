"""The browser example (examples/browser/index.html) in headless Chromium: the page, served on 127.0.0.1 by a
Python http.server thread, trains a package with onnxruntime-web (WebAssembly, one thread) and POSTs the state back;
Python's load_training_state of it holds the weights the reference loop reaches on the same batches (the rule of
tests/js_support.py) and its trained graph predicts like the Python-trained graph (``output_atol``)."""

from __future__ import annotations

import json
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from ortflow.package import load_training_state, train_package

from js_support import CHROMIUM, JS_GROUP, ROOT, make_package, node, output_atol, require_node, run_graph, \
    weights_atol

pytestmark = JS_GROUP
FIT = {"epochs": 3, "seed": 11, "shuffle": True}


class _Handler(SimpleHTTPRequestHandler):
    """The repository's files, the package under /package/, the data at /data.json; a POST to /state is kept."""

    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript", ".js": "text/javascript",
                      ".wasm": "application/wasm"}

    def __init__(self, *args, site, **kwargs):
        self.site = site
        super().__init__(*args, directory=str(ROOT), **kwargs)

    def translate_path(self, path):
        for prefix, folder in self.site["mounts"].items():
            if path.startswith(prefix):
                return str(Path(folder) / path[len(prefix):].split("?")[0])
        return super().translate_path(path)

    def do_POST(self):
        self.site["posted"] = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def site(tmp_path):
    require_node()
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: `make chromium` installs Debian's package")
    folder, X, y = make_package("mlp", "adam", tmp_path / "package")
    data = tmp_path / "data"
    data.mkdir()
    (data / "data.json").write_text(json.dumps({"X": X.tolist(), "y": y.tolist()}))
    state = {"mounts": {"/package/": folder, "/input/": data}, "posted": None, "folder": folder, "X": X, "y": y}
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Handler, site=state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()


def test_chromium_trains_a_package_and_sends_the_state_back(site):
    query = (f"package=/package/&data=/input/data.json&epochs={FIT['epochs']}&seed={FIT['seed']}&shuffle=1"
             "&autorun=1&post=/state")
    done = node("test/browser.mjs", f"{site['url']}/examples/browser/index.html?{query}", 120, CHROMIUM)
    page = json.loads(done.stdout)
    assert "epoch 3: loss" in page["log"]
    assert site["posted"] is not None
    state = load_training_state(site["folder"], site["posted"])
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
