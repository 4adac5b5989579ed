"""What the tests of the JavaScript trainer (js/, tests/test_js_*.py) share: Node and the npm packages, the training
packages of issue 38's models, and the tolerance rule for weights trained in another runtime.

Tolerance rule (weights after ``s`` optimizer steps of two float32 evaluations of the same step graph, here
onnxruntime in Python and onnxruntime-node or its WebAssembly build): each step rounds every weight a few times
(``TERM_ROUNDINGS``) at the weights' scale, and those roundings accumulate over the steps, so per tensor
``|a - b| <= 2 * s * TERM_ROUNDINGS * u32 * max|w|`` (``u32`` the float32 unit roundoff) — the rule of
tests/test_training_package.py. The WebAssembly kernels sum in another order than the native ones (no AVX): the rule
covers a reordered sum at every rounding.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bench.portable import chromium_path
from sklearn_fit import quiet_fit
from tolerances import TERM_ROUNDINGS, U32

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "js"
NODE = shutil.which("node")
NPM = shutil.which("npm")
CHROMIUM = chromium_path()
#: every JS test runs in one xdist worker: `npm ci` (when node_modules is missing) runs once
JS_GROUP = pytest.mark.xdist_group("js")
#: how the tests run the JavaScript trainer: runtime, and Trainer.load's options (by default a package's step_flat.onnx
#: runs; "node-tensors" runs step.onnx, one tensor per state tensor)
RUNTIMES = {"node": ("node", {}), "web": ("web", {}), "node-tensors": ("node", {"flat": False})}


def require_node() -> None:
    """Skip (Node is not installed) or make sure js/node_modules holds the locked packages (`npm ci`)."""
    if NODE is None:
        pytest.skip("node is not installed: the JavaScript trainer's tests need Node 20 (`make test` on CI has it)")
    if (JS / "node_modules" / "onnxruntime-node").is_dir():
        return
    if NPM is None:
        pytest.fail("js/node_modules is missing and npm is not installed: run `make js/node_modules/.stamp`")
    import fcntl

    # one `npm ci` at a time: it empties node_modules first, under the feet of another worker's node
    with open(JS / ".npm-ci.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (JS / "node_modules" / "onnxruntime-node").is_dir():
            subprocess.run([NPM, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=JS, check=True,
                           capture_output=True)


def require_chromium() -> None:
    """Node's packages (``require_node``) and Debian's chromium, which the browser tests drive (a failure if
    missing)."""
    require_node()
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: `make chromium` installs Debian's package")


def node(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run node with ``args`` from js/, failing with its stderr."""
    done = subprocess.run([NODE, *map(str, args)], cwd=JS, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"node {' '.join(map(str, args))} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done


def assert_named(outcome: dict, error: str, words: list[str]) -> None:
    """A JavaScript call's outcome ({thrown, name, message}) is the error ``error`` whose message holds ``words``."""
    assert outcome["thrown"], "no error"
    assert outcome["name"] == error, outcome
    for word in words:
        assert word in outcome["message"], (word, outcome["message"])


def weights_atol(steps: int, reference: np.ndarray) -> float:
    """The rule above for one tensor after ``steps`` steps."""
    return 2 * steps * TERM_ROUNDINGS * U32 * float(np.abs(reference).max(initial=0.0))


def state_atol(reference, name: str) -> float:
    """The rule above for the tensor ``name`` of the state ``reference`` (a TrainingState) at the scale of the terms
    its updates are computed from: a gradient sums products at the scale of the model's weights and cancels to
    much less (an intercept near 0, Adam's first moment of a small gradient differ by ~u32 of the weights' scale), so
    each tensor's scale is the larger of its own and the model's largest weight."""
    largest = max(float(np.abs(w).max(initial=0.0)) for w in reference.weights.values())
    return weights_atol(reference.steps, np.array([largest, float(np.abs(reference.tensors[name]).max(initial=0.0))]))


# --- state files written by hand (malformed ones) -----------------------------------------------------------------
def state_parts(data: bytes) -> tuple[dict, bytes]:
    """The header (parsed) and the data bytes of the state file ``data``."""
    length = int.from_bytes(data[4:8], "little")
    return json.loads(data[8: 8 + length]), data[8 + length:]


def state_file(header: dict, body: bytes, raw: str | None = None) -> bytes:
    """A state file of ``header`` (or the header text ``raw``) and the data bytes ``body``, as the format lays it out:
    the magic, the header's length, the header padded with spaces to a multiple of 4 bytes, the data."""
    text = (raw if raw is not None else json.dumps(header)).encode()
    text += b" " * (-len(text) % 4)
    return b"OFTS" + len(text).to_bytes(4, "little") + text + body


# --- issue 38's models as training packages --------------------------------------------------------------------
CASES = ("linear", "mlp", "binary", "digits", "lenet")
OPTIMIZERS = ("sgd", "adam")


def optimizer(name: str):
    from ortflow import LearningRateAdam, LearningRateSGD

    if name == "sgd":
        return LearningRateSGD(eta0=0.05, learning_rate="invscaling", power_t=0.25)
    return LearningRateAdam(eta0=0.01)


def case_data(case: str):
    """(loss graph, X, y, batch size): small data, a few steps per epoch."""
    from sklearn.datasets import load_digits, make_classification, make_regression
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.neural_network import MLPRegressor

    from ortflow import add_loss_output, to_onnx

    if case in ("linear", "mlp"):
        X, y = make_regression(60, n_features=5, noise=1.0, random_state=0)
        X, y = X.astype(np.float32), (y / 50).astype(np.float32)
        model = LinearRegression() if case == "linear" else MLPRegressor(hidden_layer_sizes=(8,), max_iter=2,
                                                                          random_state=0)
        return add_loss_output(to_onnx(quiet_fit(model, X, y)), "squared_error"), X, y, 16
    if case == "binary":
        X, y = make_classification(60, n_features=6, random_state=0)
        X = X.astype(np.float32)
        labels = np.array(["no", "yes"], dtype=object)[y]  # string classes: labels go through as text
        return add_loss_output(to_onnx(quiet_fit(LogisticRegression(max_iter=2), X, labels)), "log"), X, labels, 16
    if case == "digits":
        X, y = load_digits(return_X_y=True)
        X, y = (X[:120] / 16).astype(np.float32), y[:120]
        return add_loss_output(to_onnx(quiet_fit(LogisticRegression(max_iter=2), X, y)), "log"), X, y, 32
    import reference_data

    ref = reference_data.load("lenet")
    return add_loss_output(ref.model, "log"), ref.inputs[:96], ref.one_hot[:96], 32


def make_package(case: str, opt: str, folder: Path):
    """Export the (unfitted) trainer of ``case`` with optimizer ``opt`` to ``folder``: (folder, X, y)."""
    import ortflow

    model, X, y, batch = case_data(case)
    est = ortflow.OrtGradientOptimizer(model, learning_rate=optimizer(opt), batch_size=batch)
    ortflow.export_training_package(est, folder)
    return folder, X, y


def write_jobs(path: Path, jobs: list[dict]) -> Path:
    path.write_text(json.dumps(jobs, default=lambda a: a.tolist()))
    return path


def output_atol(reference, X) -> float:
    """How far a prediction of the graph trained in another runtime may lie from the Python-trained graph's: an output
    moves with the weights by at most the weights' tolerance times the size of what they multiply,
    ``sum_t tol_t * (1 + max_row sum|x|) * prod_t max(1, |W_t|)`` with ``|W_t|`` the largest absolute row or column
    sum of each trained matrix (kernel) and ``max|W_t|`` of each vector (activations 1-Lipschitz)."""
    tol = sum(weights_atol(reference.steps, w) for w in reference.weights.values())
    gain = 1.0
    for w in reference.weights.values():
        a = np.abs(w.astype(np.float64))
        if a.ndim >= 2:
            gain *= max(1.0, a.reshape(a.shape[0], -1).sum(axis=1).max(), a.reshape(-1, a.shape[-1]).sum(axis=0).max())
        else:
            gain *= max(1.0, float(a.max(initial=0.0)))
    return tol * (1.0 + float(np.abs(X).reshape(len(X), -1).sum(axis=1).max())) * gain


def run_graph(model_bytes, X) -> dict:
    """Every output of a graph (Python's onnxruntime) for its one input X."""
    from ortflow._ort import InferenceSession

    session = InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, {name: X})))


def train_jobs(runtime: str, jobs: list[dict], folder: Path, site: Path | None = None) -> list[dict]:
    """Train ``jobs`` (js/test/train-jobs.js's: package, X, y, fits, predictX...) in one process of ``runtime``:
    ``node`` or ``web`` (onnxruntime-node or its WebAssembly build, js/test/train-cases.mjs) or ``chromium`` (headless,
    js/test/train-cases.html; the packages must lie under ``site``, served on 127.0.0.1). Returns, per job,
    ``{"state": bytes, "model": bytes, "report": dict | None}``; a job that threw fails with its error."""
    folder.mkdir(parents=True, exist_ok=True)
    if runtime == "chromium":
        from bench.portable import PageServer, open_page

        require_chromium()
        site = Path(site).resolve()
        served = [{**job, "package": "/site/" + Path(job["package"]).resolve().relative_to(site).as_posix() + "/"}
                  for job in jobs]
        write_jobs(site / f"jobs-{folder.name}.json", served)
        with PageServer({"/site/": site}) as server:
            page = open_page(f"{server.url}/js/test/train-cases.html?jobs=/site/jobs-{folder.name}.json", timeout=300)
        out = []
        for job, result in zip(jobs, page["results"]):
            assert "error" not in result, (job["package"], result.get("error"))
            out.append({"state": base64.b64decode(result["state"]), "model": base64.b64decode(result["model"]),
                        "report": result["report"]})
        return out
    written = [{**job, "state": str(folder / f"{i}.state"), "model": str(folder / f"{i}.onnx"),
                "prediction": str(folder / f"{i}.json")} for i, job in enumerate(jobs)]
    node("test/train-cases.mjs", runtime, write_jobs(folder / "jobs.json", written))
    out = []
    for job in written:
        error = Path(f"{job['state']}.error.json")
        assert not error.exists(), (job["package"], error.read_text())
        report = Path(job["prediction"])
        out.append({"state": Path(job["state"]).read_bytes(), "model": Path(job["model"]).read_bytes(),
                    "report": json.loads(report.read_text()) if report.exists() else None})
    return out


@contextlib.contextmanager
def served_example(tmp_path: Path):
    """An MLP package (Adam) and its rows served on 127.0.0.1 for the example pages (`/package/`,
    `/input/data.json`): yields ``{"server", "folder", "X", "y"}``. Needs Node's packages and Debian's chromium."""
    from bench.portable import PageServer

    require_chromium()
    folder, X, y = make_package("mlp", "adam", tmp_path / "package")
    data = tmp_path / "data"
    data.mkdir()
    (data / "data.json").write_text(json.dumps({"X": X.tolist(), "y": y.tolist()}))
    with PageServer({"/package/": folder, "/input/": data}) as server:
        yield {"server": server, "folder": folder, "X": X, "y": y}



# --- the bundled example (examples/browser/bundled) -----------------------------------------------------------
BUNDLED = ROOT / "examples" / "browser" / "bundled"
#: the bundlers it is built with, as its app.js says (the tools: js/package.json's devDependencies)
BUNDLERS = ("esbuild", "vite", "webpack")
ESBUILD = JS / "node_modules" / "esbuild" / "bin" / "esbuild"
VITE = JS / "node_modules" / "vite" / "bin" / "vite.js"
WEBPACK = JS / "node_modules" / "webpack-cli" / "bin" / "cli.js"


def run_tool(*args, cwd: Path, timeout: float = 300) -> str:
    """Run a command, failing with its output; returns stdout and stderr together."""
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {done.returncode}:\n{output[-6000:]}")
    return output


def copy_bundled_example(folder: Path) -> Path:
    """The bundled example copied to ``folder``/bundled with the plain page's mlflow.js beside (its app.js imports
    ../mlflow.js): returns the project folder, for ortflow and onnxruntime-web to be installed into."""
    project = folder / "bundled"
    project.mkdir(parents=True)
    for name in ("index.html", "app.js", "webpack.config.mjs"):
        shutil.copy(BUNDLED / name, project / name)
    shutil.copy(BUNDLED.parent / "mlflow.js", folder / "mlflow.js")
    return project


def linked_bundled_example(folder: Path) -> Path:
    """:func:`copy_bundled_example` with js/ linked in as the project's ortflow and js/'s onnxruntime-web as its own
    (no install: the tarball's install is tests/test_js_package.py's)."""
    require_node()
    project = copy_bundled_example(folder)
    (project / "node_modules").mkdir()
    (project / "node_modules" / "ortflow").symlink_to(JS, target_is_directory=True)
    (project / "node_modules" / "onnxruntime-web").symlink_to(JS / "node_modules" / "onnxruntime-web",
                                                              target_is_directory=True)
    return project


def bundle_example(project: Path, bundler: str) -> Path:
    """Build the bundled example in ``project`` with ``bundler`` as its app.js says (no option beyond the entry and
    the output; webpack reads the example's webpack.config.mjs), failing on any warning: returns the folder to
    serve (index.html, the bundle and onnxruntime-web's .wasm)."""
    out = project / f"dist-{bundler}"
    if bundler == "esbuild":
        log = run_tool(ESBUILD, "app.js", "--bundle", "--format=esm", "--platform=browser",
                       f"--outfile={out / 'app.js'}", cwd=project)
        shutil.copy(project / "node_modules" / "onnxruntime-web" / "dist" / "ort-wasm-simd-threaded.wasm", out)
    elif bundler == "vite":
        log = run_tool(NODE, VITE, "build", "--outDir", out.name, cwd=project)
    elif bundler == "webpack":
        log = run_tool(NODE, WEBPACK, "--output-path", out.name, cwd=project)
    else:
        raise ValueError(f"bundler={bundler!r}: one of {BUNDLERS}")
    assert not re.search(r"node:|externali[sz]ed|warn", log, re.IGNORECASE), log
    if not (out / "index.html").is_file():  # Vite builds the page; the others bundle app.js alone
        shutil.copy(project / "index.html", out)
    return out
