"""Training outside Python (issue 38): epoch time of one training package on the seed cases A and D-wide in Python's
full training, onnxruntime-node, onnxruntime-web's WebAssembly engine in Node, and the same in headless Chromium.

    python -m bench.portable                     # A (30 epochs) and D-wide (20,000 rows, 3 epochs), 3 repeats
    python -m bench.portable --repeats 5 --engines python,node

Every engine trains the same package (``ortflow.export_training_package`` of the case's ``OrtGradientOptimizer``:
plain SGD at the case's constant rate, its batch size, the rows in order) from the same start on the same rows, on
one thread: ``n_threads=1`` in Python, ``intraOpNumThreads: 1`` in onnxruntime-node, ``ort.env.wasm.numThreads =
1`` for WebAssembly (Node and Chromium). Python is the trainer itself (``bench.engines.train_ortflow_full``); the
others run js/ (``Trainer.fit``, X and y passed as runtime tensors in Node, as rows of a JSON file in the page) on
the package's unrolled graphs ``steps_<K>.onnx`` for runs of full batches and ``step_flat.onnx`` (the state as one
vector) for the rest; ``node-flat`` runs ``step_flat.onnx`` for every step, ``node-tensors`` ``step.onnx`` (one
tensor per state tensor). The engines take turns within each repeat (the order rotating); a run's number is its
median epoch, the first left out (``bench.run.per_repeat``), an engine's number the median over repeats, its ratio
to Python the median of each repeat's ratio to Python's run of that repeat (paired: the load of a shared machine
changes between repeats). The CPU seconds of the process (all threads) per epoch are measured beside the wall time
in Python and Node (not in Chromium). The last epoch's losses of every engine are printed: they agree (the same step
graph). ``--max-unrolled K`` exports the package with unrolled graphs up to K steps (default: the exporter's
bound, from the step's cost; 0: none). Results:
``bench/results/portable.json`` (git-ignored), the table on stdout.

Against TensorFlow.js 4.22 (issue 47 item 4; ``--suite tfjs``, run by default after the table above): the 6-12-1 MLP
over 400 rows and the 20-256-1 MLP over 10,000 rows (scikit-learn's ``MLPRegressor`` as an ortflow package: Adam
1e-3, batch 32, mean squared error, rows in order), and TF.js's ``Dense(relu) -> Dense`` from the package's start
weights with the same Adam (rate, betas, epsilon) and batches. Engines: ``node`` (onnxruntime-node), ``wasm``
(onnxruntime-web's WebAssembly in Node), ``tfjs-node`` (TF.js's WebAssembly backend in Node, one thread: tfjs-node's
native library can't be downloaded on these machines), ``chromium`` / ``tfjs-chromium`` (headless Chromium, one
thread, a new browser context per page, the HTTP cache off: js/bench/first-use.html, js/bench/tfjs.html), and
``chromium-2`` / ``tfjs-chromium-2`` (two threads, the pages served cross-origin isolated: COOP/COEP headers);
``chromium-unrolled`` loads the package with ``unrolled: true`` (every unrolled graph that fits, created on first
use) instead of the default ``'auto'``.
In a browser: **first use**, from the page's start (navigation) to ``--tfjs-epochs`` epochs done (the runtime, the
library, the package and the rows downloaded, the runtime started, the epochs trained), then the **steady epoch**:
a second fit of ``--tfjs-more`` epochs, whose second half's median is the steady epoch (the runtime's code warmed
up, the unrolled graphs that pay created by ``unrolled: 'auto'`` as a fit goes). In Node: one fit of both counts, the
steady epoch the median of its last ``--tfjs-more // 2`` epochs. Every repeat runs every engine (the order rotating; the pages of a repeat in one
browser), the ratios are paired per repeat (ortflow's number over TF.js's of the same repeat), and the load average
is recorded before and after each repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import replace
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Sequence

import numpy as np

import ortflow

from .cases import Case, default_cases, make_data
from .engines import epoch_clock, loss_graph, train_ortflow_full
from .run import log, machine_info, per_repeat

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "js"
RESULTS = ROOT / "bench" / "results"
ENGINES = ("python", "node", "node-flat", "node-tensors", "wasm", "chromium")
TITLES = {"python": "Python (ortflow full training)", "node": "onnxruntime-node", "wasm": "WebAssembly in Node",
          "node-flat": "onnxruntime-node, one step per run",
          "chromium": "WebAssembly in Chromium", "node-tensors": "onnxruntime-node, one tensor per state tensor"}


def cases(rows_wide: int = 20_000, epochs_a: int = 30, epochs_wide: int = 3) -> list[Case]:
    """The suite's A and D-wide (D-wide at the suite's quick size: WebAssembly takes ~40x Python's time on it)."""
    suite = {c.key: c for c in default_cases()}
    return [replace(suite["A"], epochs=epochs_a), replace(suite["D-wide"], n_rows=rows_wide, epochs=epochs_wide)]


# --- serving the page ------------------------------------------------------------------------------------------
class _Handler(SimpleHTTPRequestHandler):
    """The repository's files, with folders mounted under prefixes (``{'/package/': folder}``); a POST is kept."""

    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript", ".js": "text/javascript",
                      ".wasm": "application/wasm"}

    def __init__(self, *args, site, **kwargs):
        self.site = site
        super().__init__(*args, directory=str(ROOT), **kwargs)

    def end_headers(self):
        if self.site["isolated"]:  # cross-origin isolation: SharedArrayBuffer, so WebAssembly threads
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def translate_path(self, path):
        for prefix, folder in self.site["mounts"].items():
            if path.startswith(prefix):
                return str(Path(folder) / path[len(prefix):].split("?")[0])
        return super().translate_path(path)

    def do_GET(self):
        self.site["requests"].append(self.path)
        super().do_GET()

    def do_POST(self):
        self.site["posted"] = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


class PageServer:
    """The repository served on 127.0.0.1 (a thread), for pages that load js/ and onnxruntime-web: ``mounts`` map
    URL prefixes to folders; ``posted`` holds the last POST's body, ``requests`` every GET's path. ``isolated``: every
    response carries the COOP/COEP headers of cross-origin isolation (the pages may run WebAssembly threads).
    ``host``: another loopback address (127.0.0.2) gives the page an origin of its own."""

    def __init__(self, mounts: dict, isolated: bool = False, host: str = "127.0.0.1"):
        self.site = {"mounts": dict(mounts), "posted": None, "requests": [], "isolated": isolated}
        self._server = ThreadingHTTPServer((host, 0), partial(_Handler, site=self.site))
        self.url = f"http://{host}:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def posted(self) -> bytes | None:
        return self.site["posted"]

    @property
    def requests(self) -> list[str]:
        return self.site["requests"]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def chromium_path() -> str | None:
    return next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "") if p and os.path.exists(p)), None)


def open_page(url: str, timeout: float = 600, flags: Sequence[str] = ()) -> dict:
    """Open ``url`` in headless Chromium (js/test/browser.mjs, with the Chromium ``flags`` added) and return what the
    page reports."""
    done = subprocess.run(["node", "test/browser.mjs", url, str(int(timeout)), chromium_path() or "/usr/bin/chromium"],
                          cwd=JS, capture_output=True, text=True, timeout=timeout + 60,
                          env={**os.environ, "ORTFLOW_CHROMIUM_FLAGS": " ".join(flags)})
    if done.returncode != 0:
        raise RuntimeError(f"the page {url} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


# --- the engines -------------------------------------------------------------------------------------------------
def _package(case: Case, data, folder: Path, max_unrolled: int | None = None) -> Path:
    est = ortflow.OrtGradientOptimizer(
        loss_graph(case, data), batch_size=case.batch_size, shuffle=False, n_threads=1,
        learning_rate=ortflow.LearningRateSGD(eta0=case.learning_rate, learning_rate="constant"))
    return ortflow.export_training_package(est, folder / "package", max_unrolled=max_unrolled)


def _node(runtime: str, folder: Path, rows: int, epochs: int, layout: str) -> tuple[list, list, list]:
    done = subprocess.run(["node", "bench/epoch-times.mjs", runtime, str(folder / "package"), str(folder / "X.f32"),
                           str(folder / "y.f32"), str(rows), str(epochs), layout], cwd=JS, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"node ({runtime}) failed:\n{done.stderr[-4000:]}")
    out = json.loads(done.stdout)
    return out["times"], out["cpu"], out["losses"]


def _chromium(server: PageServer, epochs: int) -> tuple[list[float], None, list[float]]:
    query = f"package=/work/package/&data=/work/data.json&epochs={epochs}&shuffle=0&autorun=1"
    page = open_page(f"{server.url}/examples/browser/index.html?{query}")
    return page["times"], None, [e["loss"] for e in page["epochs"]]


def run_engine(name: str, case: Case, data, folder: Path, server: PageServer | None):
    """(wall seconds per epoch, CPU seconds per epoch or None, loss per epoch) of one fit."""
    if name == "python":
        clock = epoch_clock()
        run = train_ortflow_full(case, data, case.epochs, 1, callbacks=[clock])
        return list(run.epoch_times), list(clock.epoch_cpu_times), list(run.losses)
    if name == "chromium":
        return _chromium(server, case.epochs)
    runtime = "web" if name == "wasm" else "node"
    layout = {"node-tensors": "tensors", "node-flat": "flat"}.get(name, "unrolled")
    return _node(runtime, folder, len(data.X), case.epochs, layout)


def run_case(case: Case, engines: list[str], repeats: int, max_unrolled: int | None = None) -> dict:
    log(f"case {case.key}: {case.title}, {case.n_train} rows, batch {case.batch_size}, {case.epochs} epochs")
    data = make_data(case)
    with tempfile.TemporaryDirectory(prefix="ortflow-portable-") as tmp:
        folder = Path(tmp)
        manifest = json.loads((_package(case, data, folder, max_unrolled) / "manifest.json").read_text())
        log(f"  unrolled graphs of {[u['steps'] for u in manifest['unrolled']]} steps")
        data.X.tofile(folder / "X.f32")
        data.y.tofile(folder / "y.f32")
        server = None
        if "chromium" in engines:
            (folder / "data.json").write_text(json.dumps({"X": data.X.tolist(), "y": data.y.ravel().tolist()}))
            server = PageServer({"/work/": folder})
        try:
            runs, cpus = {e: [] for e in engines}, {e: [] for e in engines}
            losses = {}
            for r in range(repeats):
                for name in engines[r % len(engines):] + engines[: r % len(engines)]:
                    times, cpu, loss = run_engine(name, case, data, folder, server)
                    runs[name].append(per_repeat(times))
                    if cpu is not None:
                        cpus[name].append(per_repeat(cpu))
                    losses[name] = loss[-1]
                    log(f"  {name:9s} repeat {r + 1}: {runs[name][-1] * 1e3:9.2f} ms/epoch"
                        + (f" (CPU {cpus[name][-1] * 1e3:.2f} ms)" if cpu is not None else "")
                        + f", last loss {loss[-1]:.6f}")
        finally:
            if server is not None:
                server.close()
    medians = {e: float(np.median(v)) for e, v in runs.items()}
    cpu = {e: float(np.median(v)) for e, v in cpus.items() if v}
    result = {"case": case.to_dict(), "unrolled": [u["steps"] for u in manifest["unrolled"]],
              "engines": {e: {"epoch_s": medians[e], "repeats_s": runs[e], "epoch_cpu_s": cpu.get(e),
                              "repeats_cpu_s": cpus[e], "last_loss": losses[e]} for e in engines}}
    if "python" in medians:
        result["ratio_to_python"] = {e: medians[e] / medians["python"] for e in engines}
        # paired: each repeat's ratio to Python's run of the same repeat (the load changes between repeats)
        result["paired_ratio_to_python"] = {e: float(np.median(np.array(runs[e]) / np.array(runs["python"])))
                                            for e in engines}
        if "python" in cpu:
            result["cpu_ratio_to_python"] = {e: cpu[e] / cpu["python"] for e in cpu}
    return result


def node_versions() -> dict:
    lock = json.loads((JS / "package-lock.json").read_text())["packages"]
    out = {name: lock.get(f"node_modules/{name}", {}).get("version")
           for name in ("onnxruntime-node", "onnxruntime-web", "puppeteer-core", "@tensorflow/tfjs",
                        "@tensorflow/tfjs-backend-wasm")}
    out["node"] = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    chromium = chromium_path()
    if chromium:
        out["chromium"] = subprocess.run([chromium, "--version"], capture_output=True, text=True).stdout.strip()
    return out


def table(results: list[dict]) -> str:
    engines = list(results[0]["engines"])
    lines = ["| case | " + " | ".join(f"{TITLES[e]} ms" for e in engines) + " |",
             "|---" * (len(engines) + 1) + "|"]
    for res in results:
        cells = []
        for e in engines:
            entry = res["engines"][e]
            cell = f"{entry['epoch_s'] * 1e3:.1f}"
            if entry["epoch_cpu_s"] is not None:
                cell += f" (CPU {entry['epoch_cpu_s'] * 1e3:.1f})"
            if e != "python" and "paired_ratio_to_python" in res:
                cell += f": **{res['paired_ratio_to_python'][e]:.2f}x**"
                if e in res.get("cpu_ratio_to_python", {}):
                    cell += f" (CPU {res['cpu_ratio_to_python'][e]:.2f}x)"
            cells.append(cell)
        c = res["case"]
        lines.append(f"| {c['key']} ({c['n_train']:,} rows, batch {c['batch_size']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- against TensorFlow.js 4.22 ------------------------------------------------------------------------------------
#: case -> (rows, features, hidden units)
TFJS_CASES = {"mlp-small": (400, 6, 12), "mlp-wide": (10_000, 20, 256)}
TFJS_ENGINES = ("node", "wasm", "tfjs-node", "chromium", "tfjs-chromium", "chromium-unrolled", "chromium-2",
                "tfjs-chromium-2")
TFJS_TITLES = {"node": "onnxruntime-node", "wasm": "onnxruntime-web (Node)", "tfjs-node": "TF.js wasm (Node)",
               "chromium": "ortflow, Chromium", "tfjs-chromium": "TF.js wasm, Chromium",
               "chromium-unrolled": "ortflow, Chromium, unrolled: true",
               "chromium-2": "ortflow, Chromium, 2 threads", "tfjs-chromium-2": "TF.js wasm, Chromium, 2 threads"}
#: ortflow's engine -> TF.js's engine it is compared with
TFJS_PAIRS = {"node": "tfjs-node", "wasm": "tfjs-node", "chromium": "tfjs-chromium",
              "chromium-unrolled": "tfjs-chromium", "chromium-2": "tfjs-chromium-2"}
TFJS_BATCH = 32
ADAM = {"rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}


def tfjs_inputs(folder: Path, rows: int, features: int, hidden: int) -> None:
    """The package of a features-hidden-1 MLP (scikit-learn's start, one iteration), its rows (X.f32, y.f32) and
    its start weights for TF.js (weights.json: kernel0, bias0, kernel1, bias1 as {shape, values})."""
    import warnings

    from sklearn.datasets import make_regression
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    from ortflow.package import TrainingPackage

    X, y = make_regression(rows, n_features=features, noise=1.0, random_state=0)
    X, y = X.astype(np.float32), (y / np.std(y)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = MLPRegressor(hidden_layer_sizes=(hidden,), max_iter=1, random_state=0).fit(X, y)
    est = ortflow.OrtGradientOptimizer(
        ortflow.add_loss_output(ortflow.to_onnx(mlp), "squared_error"), batch_size=TFJS_BATCH, shuffle=False,
        n_threads=1, learning_rate=ortflow.LearningRateAdam(eta0=ADAM["rate"], beta1=ADAM["beta1"],
                                                            beta2=ADAM["beta2"], epsilon=ADAM["epsilon"]))
    package = ortflow.export_training_package(est, folder / "package")
    X.tofile(folder / "X.f32")
    y.tofile(folder / "y.f32")
    start = TrainingPackage(package).initial_state().tensors
    weights = {f"{kind}{i}": {"shape": list(start[f"{name}_{i}"].shape),
                              "values": start[f"{name}_{i}"].ravel().tolist()}
               for i in range(2) for kind, name in (("kernel", "coef"), ("bias", "intercept"))}
    (folder / "weights.json").write_text(json.dumps(weights))


def _node_json(args: list[str]) -> dict:
    done = subprocess.run(["node", *args], cwd=JS, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"node {' '.join(args[:2])} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # TF.js prints a hint before


def _pages(urls: list[str], timeout: float = 600) -> list[dict]:
    """What each page set as window.benchResult (js/bench/pages.mjs: one browser, a new context per page, no cache)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(urls, f)
    try:
        done = subprocess.run(["node", "bench/pages.mjs", f.name, str(int(timeout)),
                               chromium_path() or "/usr/bin/chromium"], cwd=JS, capture_output=True, text=True,
                              timeout=timeout * len(urls) + 60)
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise RuntimeError(f"the pages failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


def _page_url(engine: str, servers: dict, rows: int, epochs: int, more: int) -> str:
    threads = 2 if engine.endswith("-2") else 1
    server = servers["isolated" if threads > 1 else "plain"]
    common = f"x=/work/X.f32&y=/work/y.f32&rows={rows}&epochs={epochs}&more={more}&threads={threads}"
    if engine.startswith("tfjs"):
        adam = "&".join(f"{k}={v}" for k, v in ADAM.items())
        return f"{server.url}/js/bench/tfjs.html?weights=/work/weights.json&{common}&batch={TFJS_BATCH}&{adam}"
    unrolled = "&unrolled=true" if engine == "chromium-unrolled" else ""
    return f"{server.url}/js/bench/first-use.html?package=/work/package/&{common}{unrolled}"


def steady_epoch(times, more: int) -> float:
    """The steady epoch of one page or process: the median of its last ``more // 2`` epochs (the second half of the
    epochs after first use), when the runtime's code has warmed up and ``unrolled: 'auto'`` has created the unrolled
    graphs that pay; TF.js's the same way."""
    return float(np.median(np.asarray(times, dtype=float)[-max(1, more // 2):]))


def run_tfjs_case(key: str, engines: list[str], repeats: int, epochs: int, more: int, rows: int | None = None) -> dict:
    n, features, hidden = TFJS_CASES[key]
    n = rows or n
    log(f"case {key}: {features}-{hidden}-1 MLP, {n} rows, batch {TFJS_BATCH}, Adam {ADAM['rate']}")
    pages = [e for e in engines if "chromium" in e]
    out = {e: {"first_use_s": [], "epoch_s": [], "losses": None, "extra": {}} for e in engines}
    loads = []
    with tempfile.TemporaryDirectory(prefix="ortflow-tfjs-") as tmp:
        folder = Path(tmp)
        tfjs_inputs(folder, n, features, hidden)
        servers = {"plain": PageServer({"/work/": folder}), "isolated": PageServer({"/work/": folder}, isolated=True)}
        try:
            for r in range(repeats):
                before = os.getloadavg()
                order = engines[r % len(engines):] + engines[: r % len(engines)]
                browser = [e for e in order if e in pages]
                results = dict(zip(browser, _pages([_page_url(e, servers, n, epochs, more) for e in browser])))
                for e in order:
                    if e in results:
                        page = results[e]
                        out[e]["first_use_s"].append(page["firstUseMs"] / 1e3)
                        out[e]["epoch_s"].append(steady_epoch(np.array(page["epochMs"]) / 1e3, more))
                        out[e]["extra"] = {k: page.get(k) for k in ("threads", "isolated", "runs", "backend")}
                        losses = page["losses"]
                    elif e == "tfjs-node":
                        got = _node_json(["bench/tfjs-epoch-times.mjs", "wasm", str(folder / "weights.json"),
                                          str(folder / "X.f32"), str(folder / "y.f32"), str(n), str(epochs + more),
                                          str(TFJS_BATCH), *map(str, ADAM.values())])
                        out[e]["epoch_s"].append(steady_epoch(got["times"], more))
                        losses = got["losses"]
                    else:
                        got = _node_json(["bench/epoch-times.mjs", "web" if e == "wasm" else "node",
                                          str(folder / "package"), str(folder / "X.f32"), str(folder / "y.f32"),
                                          str(n), str(epochs + more)])
                        out[e]["epoch_s"].append(steady_epoch(got["times"], more))
                        losses = got["losses"]
                    out[e]["losses"] = losses
                    first = out[e]["first_use_s"][-1] * 1e3 if out[e]["first_use_s"] else None
                    log(f"  {e:16s} repeat {r + 1}: " + (f"first use {first:8.1f} ms, " if first else "")
                        + f"steady epoch {out[e]['epoch_s'][-1] * 1e3:8.2f} ms, last loss {losses[-1]:.6f}")
                loads.append([before[0], os.getloadavg()[0]])
                log(f"  load average {loads[-1][0]:.2f} before, {loads[-1][1]:.2f} after")
        finally:
            for server in servers.values():
                server.close()
    result = {"case": {"key": key, "rows": n, "features": features, "hidden": hidden, "batch_size": TFJS_BATCH,
                       "epochs": epochs, "more": more, **ADAM}, "load_average": loads, "engines": {}, "ratios": {}}
    for e, v in out.items():
        result["engines"][e] = {"first_use_s": float(np.median(v["first_use_s"])) if v["first_use_s"] else None,
                                "epoch_s": float(np.median(v["epoch_s"])), "repeats_first_use_s": v["first_use_s"],
                                "repeats_epoch_s": v["epoch_s"], "last_loss": v["losses"][-1], **v["extra"]}
    for ours, theirs in TFJS_PAIRS.items():
        if ours in out and theirs in out:
            ratio = {"epoch": float(np.median(np.array(out[ours]["epoch_s"]) / np.array(out[theirs]["epoch_s"])))}
            if out[ours]["first_use_s"]:
                ratio["first_use"] = float(np.median(np.array(out[ours]["first_use_s"])
                                                     / np.array(out[theirs]["first_use_s"])))
            result["ratios"][ours] = ratio
    return result


def tfjs_table(results: list[dict]) -> str:
    """Per case: first use and steady epoch of each engine (ms), ortflow's paired ratio to TF.js beside it."""
    engines = list(results[0]["engines"])
    lines = ["| case | " + " | ".join(TFJS_TITLES[e] for e in engines) + " | load average |",
             "|---" * (len(engines) + 2) + "|"]
    for res in results:
        cells = []
        for e in engines:
            entry, ratio = res["engines"][e], res["ratios"].get(e, {})
            cell = []
            if entry["first_use_s"] is not None:
                cell.append(f"first use {entry['first_use_s'] * 1e3:.0f}"
                            + (f" (**{ratio['first_use']:.2f}x**)" if "first_use" in ratio else ""))
            cell.append(f"epoch {entry['epoch_s'] * 1e3:.1f}" + (f" (**{ratio['epoch']:.2f}x**)" if ratio else ""))
            cells.append("; ".join(cell))
        c = res["case"]
        load = np.array(res["load_average"])
        lines.append(f"| {c['features']}-{c['hidden']}-1 MLP, {c['rows']:,} rows | " + " | ".join(cells)
                     + f" | {load.min():.1f}-{load.max():.1f} |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.portable", description=__doc__.splitlines()[0])
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {','.join(ENGINES)}")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rows-wide", type=int, default=20_000, help="rows of D-wide")
    p.add_argument("--epochs-a", type=int, default=30, help="epochs of A (a run's number: its median epoch)")
    p.add_argument("--epochs-wide", type=int, default=3)
    p.add_argument("--max-unrolled", type=int, default=None,
                   help="bound of the unrolled step graphs (export_training_package's max_unrolled; default: chosen "
                   "from the step's cost)")
    p.add_argument("--suite", default="portable,tfjs",
                   help="comma-separated: portable (the engines above on A and D-wide), tfjs (against TF.js 4.22)")
    p.add_argument("--tfjs-engines", default=",".join(TFJS_ENGINES),
                   help=f"comma-separated, of {','.join(TFJS_ENGINES)}")
    p.add_argument("--tfjs-cases", default=",".join(TFJS_CASES), help=f"comma-separated, of {','.join(TFJS_CASES)}")
    p.add_argument("--tfjs-rows", type=int, default=None, help="rows of every TF.js case (default: each case's)")
    p.add_argument("--tfjs-epochs", type=int, default=3, help="epochs of first use")
    p.add_argument("--tfjs-more", type=int, default=20,
                   help="epochs after first use (the steady epoch: the median of their second half)")
    p.add_argument("--out", default=str(RESULTS / "portable.json"))
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    suites = [s for s in args.suite.split(",") if s]
    engines = [e for e in args.engines.split(",") if e] if "portable" in suites else []
    tfjs_engines = [e for e in args.tfjs_engines.split(",") if e] if "tfjs" in suites else []
    tfjs_cases = [c for c in args.tfjs_cases.split(",") if c]
    for what, given, known in (("suites", suites, ("portable", "tfjs")), ("engines", engines, ENGINES),
                               ("TF.js engines", tfjs_engines, TFJS_ENGINES), ("TF.js cases", tfjs_cases, TFJS_CASES)):
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise SystemExit(f"unknown {what} {unknown}: choose among {list(known)}")
    if shutil.which("node") is None or not (JS / "node_modules" / "onnxruntime-node").is_dir():
        raise SystemExit("bench.portable needs node and js/node_modules (make js/node_modules/.stamp)")
    if any("chromium" in e for e in engines + tfjs_engines) and chromium_path() is None:
        raise SystemExit("the chromium engines need Debian's chromium (make chromium)")
    if any(e.startswith("tfjs") for e in tfjs_engines) and not (JS / "node_modules" / "@tensorflow" / "tfjs").is_dir():
        raise SystemExit("the TF.js engines need js/node_modules/@tensorflow (npm ci in js/)")
    info = machine_info(1)
    info["versions"].update(node_versions())
    results = [run_case(case, engines, args.repeats, args.max_unrolled) for case in cases(args.rows_wide, args.epochs_a,
                                                                       args.epochs_wide)] if engines else []
    tfjs = [run_tfjs_case(key, tfjs_engines, args.repeats, args.tfjs_epochs, args.tfjs_more, args.tfjs_rows)
            for key in tfjs_cases] if tfjs_engines else []
    threads = {"python": "n_threads=1", "node": "intraOpNumThreads=1", "node-tensors": "intraOpNumThreads=1",
               "node-flat": "intraOpNumThreads=1",
               "wasm": "ort.env.wasm.numThreads=1", "chromium": "ort.env.wasm.numThreads=1",
               "tfjs-node": "setThreadsCount(1), wasm backend", "tfjs-chromium": "setThreadsCount(1), wasm backend",
               "chromium-2": "ort.env.wasm.numThreads=2, cross-origin isolated",
               "chromium-unrolled": "ort.env.wasm.numThreads=1, Trainer.load(..., {unrolled: true})",
               "tfjs-chromium-2": "setThreadsCount(2), wasm backend, cross-origin isolated"}
    report = {"machine": info, "threads": threads, "results": results, "tfjs": tfjs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    if results:
        print(table(results))
    if tfjs:
        print(tfjs_table(tfjs))
    log(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
