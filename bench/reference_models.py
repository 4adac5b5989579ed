"""Time per epoch of the two networks exported from PyTorch (issue 26, item 5): a LeNet-style CNN on the 8x8 digits
and a two-layer transformer encoder over int64 tokens (tests/reference_models.py, committed in tests/data/reference).

    python -m bench.reference_models [--models lenet,transformer] [--threads 1,2] [--repeats 5] [--epochs 4]
                                     [--profile-steps 200] [--json FILE]

Engines, at the same thread count T (onnxruntime's intra-op threads, ``torch.set_num_threads``), from the same
weights, on the same batches in order, plain SGD on the mean softmax cross-entropy (the settings of
tests/reference_data.py):

- ``torch``: PyTorch's own loop on the ``nn.Module`` (``zero_grad``, ``cross_entropy``, ``backward``,
  ``torch.optim.SGD.step``);
- ``ortflow-full``: ``OrtGradientOptimizer`` on the exported graph with ``add_loss_output(graph, 'log')``;
- ``ortflow-fwbw``: ``OrtGradientForwardBackwardOptimizer`` on the exported graph, ``learning_loss='log'``;
- ``ortflow-full-head`` and ``torch-head``: the same, fine-tuning only the head (``fc.*`` / ``head.*``; torch:
  the other parameters ``requires_grad=False`` and out of the optimizer).

Each repeat fits every engine once, in an order rotated per repeat; a repeat's figure is its median epoch (the
first left out from 3 epochs on), and ratios are paired per repeat (engines timed next to each other), median over
repeats. The set-up (graphs, sessions, the frozen prefix) is not in the epochs. Without torch (the plain build)
the torch engines are skipped.

``--profile-steps N`` then runs N training steps of full training's step graph (batches of the case's size, in
order) in a session with onnxruntime's profiler on, and lists the nodes and op types taking the most kernel time,
and the share of the run outside any kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
import warnings
from collections import defaultdict

import numpy as np

import ortflow
from tests import reference_data

from .engines import epoch_clock

HEAD = {"lenet": "fc.*", "transformer": "head.*"}
ENGINES = ("torch", "ortflow-full", "ortflow-fwbw", "torch-head", "ortflow-full-head")


def _ortflow(engine: str, ref, epochs: int, threads: int) -> tuple[list[float], list[float], list[float]]:
    """Wall and CPU seconds of every epoch, loss of every epoch."""
    clock = epoch_clock()
    settings = dict(max_iter=epochs, learning_rate=ref.learning_rate, lr_schedule="constant",
                    batch_size=ref.batch_size, shuffle=False, n_threads=threads, callbacks=[clock])
    if engine.endswith("-head"):
        settings["weights_to_train"] = [HEAD[ref.name]]
    if engine.startswith("ortflow-full"):
        trainer = ortflow.OrtGradientOptimizer(ortflow.add_loss_output(ref.model, "log"), **settings)
    else:
        trainer = ortflow.OrtGradientForwardBackwardOptimizer(ref.model, learning_loss="log", **settings)
    trainer.fit(ref.inputs, ref.one_hot)
    return clock.epoch_times, clock.epoch_cpu_times, [float(v) for v in trainer.train_losses_]


def _torch(engine: str, ref, epochs: int, threads: int) -> tuple[list[float], list[float], list[float]]:
    import torch

    from tests import reference_models

    torch.set_num_threads(threads)
    model = reference_models.BUILDERS[ref.name]()
    if engine.endswith("-head"):
        prefix = HEAD[ref.name][: -len("*")]
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(name.startswith(prefix))
    times = []
    losses = reference_models.torch_training(model, ref.inputs, ref.labels, ref.learning_rate, ref.batch_size, epochs,
                                             times)
    return [wall for wall, _ in times], [cpu for _, cpu in times], [float(v) for v in losses]


def _per_repeat(times: list[float]) -> float:
    """A fit's figure: its median epoch, the first (graphs built in its first batch) left out from 3 epochs on."""
    return float(np.median(times[1:] if len(times) >= 3 else times))


def _summary(values: list[float]) -> dict:
    return {"median": float(np.median(values)), "min": float(min(values)), "max": float(max(values)),
            "all": list(values)}


def measure(name: str, threads: int, repeats: int, epochs: int, log=print) -> dict:
    """Every engine's ms per epoch (wall and CPU, one figure per repeat), last losses and paired ratios for one
    model."""
    ref = reference_data.load(name)
    engines = list(ENGINES)
    skipped = {}
    try:
        import torch  # noqa: F401
    except ImportError:
        skipped = {e: "torch is not installed" for e in engines if e.startswith("torch")}
        engines = [e for e in engines if e not in skipped]
    wall, cpu = {e: [] for e in engines}, {e: [] for e in engines}
    losses = {}
    for r in range(repeats):
        order = engines[r % len(engines):] + engines[: r % len(engines)]
        for engine in order:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                times, cpu_times, curve = (_torch if engine.startswith("torch") else _ortflow)(engine, ref, epochs,
                                                                                               threads)
            wall[engine].append(_per_repeat(times) * 1e3)
            cpu[engine].append(_per_repeat(cpu_times) * 1e3)
            losses[engine] = curve
        log(f"  {name} T={threads} repeat {r + 1}/{repeats}: "
            + ", ".join(f"{e}={wall[e][-1]:.1f}ms" for e in order))

    def ratio(a, b, figures):
        if a not in figures or b not in figures:
            return None
        paired = np.asarray(figures[a]) / np.asarray(figures[b])
        return {"median": float(np.median(paired)), "min": float(paired.min()), "max": float(paired.max())}

    pairs = [("ortflow-full", "torch"), ("ortflow-fwbw", "torch"), ("ortflow-full-head", "ortflow-full"),
             ("torch-head", "torch"), ("ortflow-full-head", "torch-head")]
    return {
        "model": name, "threads": threads, "repeats": repeats, "epochs": epochs,
        "rows": int(len(ref.labels)), "batch_size": ref.batch_size,
        "ms_per_epoch": {e: _summary(v) for e, v in wall.items()},
        "cpu_ms_per_epoch": {e: _summary(v) for e, v in cpu.items()},
        "losses": losses,
        "skipped": skipped,
        "ratios": {f"{a} / {b}": ratio(a, b, wall) for a, b in pairs},
        "cpu_ratios": {f"{a} / {b}": ratio(a, b, cpu) for a, b in pairs},
    }


def _part(node: str) -> str:
    """Which part of the step a node of the step graph belongs to: the exported network's forward nodes keep
    torch's names (``/conv1/Conv``), the loss added by ortflow, the gradient and update nodes ortflow builds."""
    if node.startswith("/"):
        return "forward"
    if node.startswith("grad_") or "_grad" in node:
        return "backward"
    return "loss and update"


def profile_step_graph(name: str, threads: int, steps: int, warmup: int = 5, top: int = 12) -> dict:
    """Kernel time per node (its median over the steps), op type and part (forward, backward, loss and update) of
    full training's step graph (all weights, batches of the case's size in order, the weights fed back), from
    onnxruntime's profiler, the first ``warmup`` runs left out; and the wall time per run of the same graph without
    the profiler."""
    from ortflow._ort import InferenceSession, SessionOptions
    from ortflow.autodiff import training_step
    from ortflow.autodiff.training import LEARNING_RATE, UPDATED
    from ortflow.runtime.validation import check_weights_to_train

    ref = reference_data.load(name)
    loss_model = ortflow.add_loss_output(ref.model, "log")
    weights = check_weights_to_train(loss_model, None)
    rate = ortflow.LearningRateSGD(eta0=ref.learning_rate, learning_rate="constant")
    bs = ref.batch_size
    step = training_step(loss_model, weights, rate, loss_output="loss", batch_rows=bs).SerializeToString()
    n_full = len(ref.labels) // bs

    def run(options) -> tuple[InferenceSession, float]:
        options.intra_op_num_threads = threads
        sess = InferenceSession(step, options, providers=["CPUExecutionProvider"])
        state = {w: v for w, v in ortflow.get_initializers(loss_model).items() if w in weights}
        outputs = [o.name for o in sess.get_outputs()]
        wall = 0.0
        for i in range(warmup + steps):
            rows = slice((i % n_full) * bs, (i % n_full + 1) * bs)
            feeds = {ref.input_name: ref.inputs[rows], "label": ref.one_hot[rows],
                     LEARNING_RATE: np.array(ref.learning_rate, dtype=np.float32), **state}
            begin = time.perf_counter()
            values = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
            wall += (time.perf_counter() - begin) if i >= warmup else 0.0
            state.update({o[: -len(UPDATED)]: v for o, v in zip(outputs[1:], values[1:])})
        return sess, wall / steps * 1e6

    _, plain_us = run(SessionOptions())
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as folder:
        options = SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(folder, "step")
        sess, profiled_us = run(options)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    starts = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run")
    after = starts[warmup]
    durations, op_of = defaultdict(list), {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= after:
            node = event["name"][: -len("_kernel_time")]
            durations[node].append(event["dur"])
            op_of[node] = event["args"].get("op_name", "?")
    # a node's median over the steps: on a machine shared with other jobs one preempted run adds milliseconds to
    # whichever node it hits, and sums would rank those
    by_node = {node: float(np.median(d)) for node, d in durations.items()}
    by_op, by_part = defaultdict(float), defaultdict(float)
    for node, us in by_node.items():
        by_op[op_of[node]] += us
        by_part[_part(node)] += us
    kernels = sum(by_node.values())

    def ranked(table):
        return sorted(table.items(), key=lambda kv: -kv[1])

    return {
        "model": name, "threads": threads, "steps": steps, "batch_size": bs, "nodes": len(op_of),
        "wall_us_per_step": plain_us, "profiled_us_per_step": profiled_us, "kernel_us_per_step": kernels,
        "parts": [{"part": p, "us_per_step": d, "share": d / kernels} for p, d in ranked(by_part)],
        "op_types": [{"op": op, "us_per_step": d, "share": d / kernels} for op, d in ranked(by_op)],
        "top_nodes": [{"node": n, "op": op_of[n], "us_per_step": d, "share": d / kernels}
                      for n, d in ranked(by_node)[:top]],
    }


def markdown(results: list[dict], profiles: list[dict]) -> str:
    out = []
    for r in results:
        out += [f"**{r['model']}**, {r['rows']:,} rows, batch {r['batch_size']}, T={r['threads']} "
                f"({r['repeats']} repeats of {r['epochs']} epochs)", "",
                "| engine | wall ms / epoch, median (min..max) | CPU ms / epoch | last epoch's loss |",
                "|---|---|---|---|"]
        for e, ms in r["ms_per_epoch"].items():
            out.append(f"| {e} | {ms['median']:.1f} ({ms['min']:.1f}..{ms['max']:.1f}) | "
                       f"{r['cpu_ms_per_epoch'][e]['median']:.1f} | {r['losses'][e][-1]:.5f} |")
        out += ["", "| paired ratio | wall, median (min..max) | CPU, median |", "|---|---|---|"]
        for label, v in r["ratios"].items():
            if v is not None:
                out.append(f"| {label} | {v['median']:.2f} ({v['min']:.2f}..{v['max']:.2f}) | "
                           f"{r['cpu_ratios'][label]['median']:.2f} |")
        out.append("")
    for p in profiles:
        out += [f"**Step graph of {p['model']}** ({p['nodes']} nodes run, batch {p['batch_size']}, T={p['threads']}, "
                f"{p['steps']} steps): {p['wall_us_per_step']:.0f} µs per run ({p['profiled_us_per_step']:.0f} with "
                f"the profiler on), {p['kernel_us_per_step']:.0f} µs in kernels (sum of the nodes' medians); by part: "
                + ", ".join(f"{x['part']} {x['share']:.0%}" for x in p["parts"]), "",
                "| op type | µs / step | share of kernel time |", "|---|---|---|"]
        out += [f"| {o['op']} | {o['us_per_step']:.1f} | {o['share']:.1%} |" for o in p["op_types"][:10]]
        out += ["", "| slowest nodes | op | µs / step | share |", "|---|---|---|---|"]
        out += [f"| `{n['node']}` | {n['op']} | {n['us_per_step']:.1f} | {n['share']:.1%} |" for n in p["top_nodes"]]
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reference_models", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(reference_data.NAMES))
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--profile-steps", type=int, default=0, help="profile this many steps of the step graph")
    parser.add_argument("--json", default=None, help="write the results to this file")
    args = parser.parse_args(argv)
    from ortflow._ort import ort, runtime_name

    ort.set_default_logger_severity(3)
    models = args.models.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    print(f"{runtime_name()}, Python {platform.python_version()}, {os.cpu_count()} logical cores")
    results = [measure(m, t, args.repeats, args.epochs) for m in models for t in threads]
    profiles = [profile_step_graph(m, t, args.profile_steps) for m in models for t in threads] \
        if args.profile_steps else []
    print(markdown(results, profiles))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runtime": runtime_name(), "python": platform.python_version(), "results": results,
                       "profiles": profiles}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
