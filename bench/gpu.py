"""ortflow's full training on a GPU against PyTorch's own loop on the same GPU, at the same precision (issue 39).

    python -m bench.gpu [--cases mlp-1024,mlp-2048,lenet,transformer,A] [--precisions fp32,tf32] [--repeats 5]
                        [--epochs 4] [--json FILE] [--no-docs]
    python -m bench.gpu --cpu-smoke [--json FILE] [--doc FILE]   # the same code on CPU, tiny sizes (the tests)

Cases (the table of issue 39; every one plain SGD, same start, same batches in order, no shuffling):

- ``mlp-1024``: MLP (1024, 1024), 65,536 x 256 regression rows, batch 1024, mean squared error;
- ``mlp-2048``: MLP (2048, 2048), 131,072 x 512, batch 4096 (4.1 TFLOP an epoch);
- ``lenet`` and ``transformer``: the networks exported from PyTorch (tests/data/reference), their data tiled to
  28,752 and 8,192 rows, batch 512, mean cross-entropy;
- ``A``: the seed's case A (bench.cases: MLP (50, 10), batch 15).

Engines: ``ortflow``, :class:`ortflow.OrtGradientOptimizer` with ``device='cuda'`` and ``precision``; ``torch``,
the same network as an ``nn.Module`` on the GPU, the data moved there once, per batch ``zero_grad``, loss,
``backward``, ``torch.optim.SGD.step``, the loss summed on the device (read once an epoch), with
``torch.backends.cuda.matmul.allow_tf32`` (and cuDNN's) set from the precision. Each repeat fits both, in an order
alternated per repeat; a repeat's figure is its median epoch (the first left out from 3 epochs on); the ratio
``ortflow / torch`` is paired per repeat, median over repeats. The card's name, the versions and the table go to
the ``BENCH:GPU`` block of docs/PERFORMANCE.md. Without a GPU (no CUDA provider in onnxruntime, or torch without
CUDA) it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BEGIN = "<!-- BENCH:GPU:BEGIN (written by python -m bench.gpu; edit outside these markers) -->"
END = "<!-- BENCH:GPU:END -->"
DOC = Path(__file__).resolve().parent.parent / "docs" / "PERFORMANCE.md"


@dataclass(frozen=True)
class GpuCase:
    key: str
    title: str
    kind: str  # "mlp" or a reference network's name
    rows: int
    batch_size: int
    n_features: int = 0
    hidden: tuple = ()
    learning_rate: float = 0.01


CASES = {
    "mlp-1024": GpuCase("mlp-1024", "MLP (1024,1024), 65,536 x 256, batch 1024", "mlp", 65_536, 1024, 256,
                        (1024, 1024)),
    "mlp-2048": GpuCase("mlp-2048", "MLP (2048,2048), 131,072 x 512, batch 4096", "mlp", 131_072, 4096, 512,
                        (2048, 2048)),
    "lenet": GpuCase("lenet", "exported LeNet, 28,752 rows, batch 512", "lenet", 28_752, 512, learning_rate=0.1),
    "transformer": GpuCase("transformer", "exported transformer, 8,192 rows, batch 512", "transformer", 8_192, 512,
                           learning_rate=0.1),
    "A": GpuCase("A", "seed case A: MLP (50,10), 750 x 100, batch 15", "mlp", 750, 15, 100, (50, 10)),
}
#: the same cases, small enough for a CPU in the tests (--cpu-smoke)
SMOKE = {
    "mlp-1024": GpuCase("mlp-1024", "MLP (16,16), 256 x 8, batch 64", "mlp", 256, 64, 8, (16, 16)),
    "lenet": GpuCase("lenet", "exported LeNet, 128 rows, batch 64", "lenet", 128, 64, learning_rate=0.1),
    "transformer": GpuCase("transformer", "exported transformer, 64 rows, batch 32", "transformer", 64, 32,
                           learning_rate=0.1),
    "A": GpuCase("A", "seed case A, 60 x 10, batch 15", "mlp", 60, 15, 10, (5,)),
}


# --- the problems --------------------------------------------------------------------------------------------
def mlp_problem(case: GpuCase, seed: int = 0) -> dict:
    """Regression rows and an MLP's start (He-scaled normal weights, zero biases): X, y (n, 1), layers."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((case.rows, case.n_features), dtype=np.float32)
    y = (X @ rng.standard_normal((case.n_features, 1), dtype=np.float32) / np.sqrt(case.n_features)).astype(
        np.float32)
    sizes = [case.n_features, *case.hidden, 1]
    layers = [((rng.standard_normal((a, b), dtype=np.float32) * np.sqrt(2.0 / a)).astype(np.float32),
               np.zeros(b, np.float32)) for a, b in zip(sizes[:-1], sizes[1:])]
    return {"X": X, "y": y, "layers": layers}


def mlp_graph(layers) -> "onnx.ModelProto":  # noqa: F821
    """The MLP as ONNX (MatMul, Add, Relu between layers), input ``X`` (N, d), output ``variable`` (N, 1)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, x = [], [], "X"
    for i, (coef, bias) in enumerate(layers):
        inits += [numpy_helper.from_array(coef, f"coef_{i}"), numpy_helper.from_array(bias, f"intercept_{i}")]
        nodes += [helper.make_node("MatMul", [x, f"coef_{i}"], [f"mm_{i}"]),
                  helper.make_node("Add", [f"mm_{i}", f"intercept_{i}"], [f"lin_{i}"])]
        x = f"lin_{i}"
        if i < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [x], [f"act_{i}"]))
            x = f"act_{i}"
    nodes[-1].output[0] = "variable"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                                           [None, layers[0][0].shape[0]])],
                              [helper.make_tensor_value_info("variable", TensorProto.FLOAT, [None, 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def torch_mlp(layers):
    import torch

    modules = []
    for i, (coef, bias) in enumerate(layers):
        linear = torch.nn.Linear(*coef.shape)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(coef.T)))
            linear.bias.copy_(torch.from_numpy(bias))
        modules.append(linear)
        if i < len(layers) - 1:
            modules.append(torch.nn.ReLU())
    return torch.nn.Sequential(*modules)


def problem(case: GpuCase) -> dict:
    """What both engines train: the ONNX graph with its loss, a torch builder, the inputs and targets."""
    import ortflow

    if case.kind == "mlp":
        p = mlp_problem(case)
        return {"loss_graph": ortflow.add_loss_output(mlp_graph(p["layers"]), "squared_error"),
                "torch": lambda: torch_mlp(p["layers"]), "X": p["X"], "y": p["y"], "torch_y": p["y"],
                "loss": "mse"}
    from tests import reference_data

    ref = reference_data.load(case.kind)
    tiles = -(-case.rows // len(ref.labels))
    take = lambda a: np.concatenate([a] * tiles)[: case.rows]  # noqa: E731

    def build():
        from tests import reference_models

        return reference_models.BUILDERS[case.kind]()

    return {"loss_graph": ortflow.add_loss_output(ref.model, "log"), "torch": build, "X": take(ref.inputs),
            "y": take(ref.one_hot), "torch_y": take(ref.labels), "loss": "cross_entropy"}


# --- the engines ---------------------------------------------------------------------------------------------
def set_torch_precision(precision: str) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"


def run_ortflow(case: GpuCase, p: dict, device: str, precision: str, epochs: int) -> tuple[list[float], float]:
    """Seconds of every epoch and the last epoch's loss."""
    import ortflow

    from .engines import epoch_clock

    clock = epoch_clock()
    trainer = ortflow.OrtGradientOptimizer(
        p["loss_graph"], max_iter=epochs, batch_size=case.batch_size, learning_rate=case.learning_rate,
        lr_schedule="constant", shuffle=False, device=device, precision=precision, callbacks=[clock])
    trainer.fit(p["X"], p["y"])
    return clock.epoch_times, float(trainer.train_losses_[-1])


def run_torch(case: GpuCase, p: dict, device: str, precision: str, epochs: int) -> tuple[list[float], float]:
    import torch

    set_torch_precision(precision)
    model = p["torch"]().to(device)
    model.eval()  # as exported: batch norm on its running statistics (no dropout in these networks)
    x, y = torch.from_numpy(p["X"]).to(device), torch.from_numpy(p["torch_y"]).to(device)
    loss_fn = torch.nn.functional.mse_loss if p["loss"] == "mse" else torch.nn.functional.cross_entropy
    optimizer = torch.optim.SGD(model.parameters(), lr=case.learning_rate)
    times, last = [], float("nan")
    for _ in range(epochs):
        _sync(device)
        begin = time.perf_counter()
        total = torch.zeros((), device=device)
        for start in range(0, len(x), case.batch_size):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[start: start + case.batch_size]), y[start: start + case.batch_size])
            loss.backward()
            optimizer.step()
            total += loss.detach() * len(y[start: start + case.batch_size])
        last = float(total) / len(x)  # reads the device once an epoch (and waits for it)
        times.append(time.perf_counter() - begin)
    return times, last


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _per_repeat(times: list[float]) -> float:
    return float(np.median(times[1:] if len(times) >= 3 else times))


def measure(case: GpuCase, device: str, precision: str, repeats: int, epochs: int, log=print) -> dict:
    """ms per epoch of both engines (one figure per repeat), their last losses and the paired ratio."""
    p = problem(case)
    engines = {"ortflow": run_ortflow, "torch": run_torch}
    figures, losses = {e: [] for e in engines}, {}
    for r in range(repeats):
        order = list(engines) if r % 2 == 0 else list(engines)[::-1]
        for engine in order:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                times, loss = engines[engine](case, p, device, precision, epochs)
            figures[engine].append(_per_repeat(times) * 1e3)
            losses[engine] = loss
        log(f"  {case.key} {precision} repeat {r + 1}/{repeats}: "
            + ", ".join(f"{e}={figures[e][-1]:.1f}ms" for e in order))
    paired = np.asarray(figures["ortflow"]) / np.asarray(figures["torch"])
    return {"case": case.key, "title": case.title, "precision": precision, "repeats": repeats, "epochs": epochs,
            "ms_per_epoch": {e: {"median": float(np.median(v)), "all": v} for e, v in figures.items()},
            "last_loss": losses,
            "ratio": {"median": float(np.median(paired)), "min": float(paired.min()), "max": float(paired.max())}}


# --- the machine and the report ------------------------------------------------------------------------------
def gpu_missing() -> str | None:
    """Why this machine cannot run the GPU benchmark, or None."""
    import ortflow

    info = ortflow.device_info()
    if "CUDAExecutionProvider" not in info["providers"]:
        from ortflow._ort import cuda_help

        return f"no GPU for onnxruntime: {cuda_help()}"
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install torch with CUDA, as the PyTorch side runs on the GPU)"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (a CPU build, or no GPU)"
    return None


def machine(device: str) -> dict:
    import onnxruntime

    import ortflow

    info = ortflow.device_info()
    out = {"device": device, "python": platform.python_version(), "onnxruntime": f"{info['package']} "
           f"{info['version']}", "cuda_build": info["cuda_version"], "gpu": info["gpu"]}
    try:
        import torch

        out["torch"] = torch.__version__
        if device.startswith("cuda"):
            out["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        out["torch"] = None
    out["onnxruntime_providers"] = onnxruntime.get_available_providers()
    return out


def markdown(results: list[dict], host: dict) -> str:
    card = host["gpu"] or "no GPU (CPU smoke run)"
    lines = [f"Run: `python -m bench.gpu` on **{card}** ({host['device']}), {host['onnxruntime']} (CUDA build "
             f"{host['cuda_build']}), torch {host['torch']}, Python {host['python']}. ms per epoch, median of the "
             "repeats; ratio ortflow / PyTorch paired per repeat (median, min-max); goal: at most 1.0.", "",
             "| case | precision | ortflow | PyTorch | ratio | last loss ortflow / PyTorch |",
             "|---|---|---|---|---|---|"]
    for r in results:
        ms, ratio = r["ms_per_epoch"], r["ratio"]
        lines.append(f"| {r['title']} | {r['precision']} | {ms['ortflow']['median']:.1f} | "
                     f"{ms['torch']['median']:.1f} | {ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f}) | "
                     f"{r['last_loss']['ortflow']:.4g} / {r['last_loss']['torch']:.4g} |")
    return "\n".join(lines)


def update_doc(path: Path, text: str) -> None:
    """Replace the ``BENCH:GPU`` block of ``path`` (appended under a 'GPU' heading when absent)."""
    from .report import update_docs

    update_docs(path, text, BEGIN, END, heading="GPU")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--precisions", default="fp32,tf32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--doc", type=Path, default=DOC, help="the Markdown file whose BENCH:GPU block is written")
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny cases on the CPU (both engines): the code path, for the tests; no timing meaning")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        device, table, repeats, epochs = "cpu", SMOKE, 2, 2
        keys = [k for k in args.cases.split(",") if k in SMOKE] if args.cases != ",".join(CASES) else list(SMOKE)
    else:
        missing = gpu_missing()
        if missing:
            print(f"bench.gpu needs a GPU: {missing}. (--cpu-smoke runs the code on the CPU.)", file=sys.stderr)
            return 2
        device, table, repeats, epochs, keys = "cuda", CASES, args.repeats, args.epochs, args.cases.split(",")
    unknown = [k for k in keys if k not in table]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {list(table)}")
    host = machine(device)
    print(f"bench.gpu on {host['gpu'] or device}: {host['onnxruntime']}, torch {host['torch']}")
    results = [measure(table[k], device, precision, repeats, epochs) for k in keys
               for precision in args.precisions.split(",")]
    text = markdown(results, host)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"machine": host, "results": results}, indent=1))
    if not args.no_docs:
        update_doc(args.doc, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
