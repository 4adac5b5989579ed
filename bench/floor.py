"""Case A against onnxruntime's own floor, and the set-up of repeated fits.

    python -m bench.floor                 # 7 interleaved repeats, 1 thread (the default on case A)
    python -m bench.floor --repeats 5 --threads 2

Per batch of case A (15 rows through the MLP (50,10)), median over repeats of the median epoch:

- ``full floor``: the training-step graph of a fitted ``OrtGradientOptimizer`` (ortflow's own, the default) run
  on its bound buffers in a bare Python loop, the loss read back (no row copies, no ortflow code per batch);
- ``full ortflow``: the same session through ``OrtGradientOptimizer._train_rows``;
- ``fwbw agent floor``: ``TrainingAgent.run_forward`` + ``run_backward`` of the static training graph on bound
  feeds; ``fwbw floor``: the same plus the loss graph and the update graph (every onnxruntime call of a batch, no
  copies); ``fwbw ortflow``: ``OrtGradientForwardBackwardOptimizer._train_rows``.

Overhead = ortflow - floor, in microseconds per batch. Wall time (``perf_counter``) and CPU time
(``process_time``, less disturbed by other processes on a shared machine) are both reported.

Set-up: a one-epoch ``fit`` on case A: full training on ortflow's step graphs with the cache emptied before the
fit (every first fit of a graph) and holding that graph (a GridSearchCV clone), the same with onnxruntime's
artifacts (``gradients='onnxruntime'``), and forward-backward training; CPU and wall time of the whole ``fit``.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np

import ortflow
from ortflow.runtime.artifact_cache import STEP_GRAPHS, TRAINING_ARTIFACTS

from .cases import default_cases, make_data
from .engines import _fwbw_learning_rate, loss_graph, prediction_graph, quiet_ort_info
from .run import machine_info

RESULTS = Path(__file__).resolve().parent / "results"


def _clocks():
    return time.perf_counter(), time.process_time()


def _since(start) -> tuple[float, float]:
    wall, cpu = _clocks()
    return wall - start[0], cpu - start[1]


_GRAPHS: dict = {}


def fitted(kind: str, case, data, threads: int, gradients: str = "auto"):
    """A one-epoch fit (the graphs are built once, outside the fit)."""
    if not _GRAPHS:
        _GRAPHS.update(full=loss_graph(case, data), fwbw=prediction_graph(data))
    if kind == "full":
        trainer = ortflow.OrtGradientOptimizer(_GRAPHS["full"], max_iter=1, batch_size=case.batch_size,
                                               learning_rate=case.learning_rate, shuffle=False, n_threads=threads,
                                               gradients=gradients)
    else:
        trainer = ortflow.OrtGradientForwardBackwardOptimizer(
            _GRAPHS["fwbw"], max_iter=1, batch_size=case.batch_size,
            learning_rate=_fwbw_learning_rate(case), learning_loss="squared_error", shuffle=False,
            n_threads=threads)
    return trainer.fit(data.X, data.y)


def full_floor_epoch(trainer, data, batch: int) -> None:
    b = trainer._rt_batches[batch][0]
    read_loss = trainer._rt_runtime._loss.scalar
    for i in range(len(data.X) // batch):
        b.run(b.bindings[i % 2], None)
        read_loss()


def fwbw_floor_epoch(trainer, n_batches: int, batch: int, with_graphs: bool) -> None:
    b = trainer._rt_batches[batch][0]
    runtime = trainer._rt_runtime
    rate, grads = runtime.update, runtime.grad_fetches
    run_loss = runtime.loss_fn._sess.run_with_iobinding
    step = rate.stepper(0.0)  # a zero rate: the weights stay, the update graph still runs
    for _ in range(n_batches):
        state = runtime.fb.new_state()
        b.agent.run_forward(b.fw_feeds[rate.parity_], b.fw_fetches, state, b.cache)
        if with_graphs:
            run_loss(b.loss_binding, None)
        b.agent.run_backward(b.bw_feeds, grads, state)
        if with_graphs:
            step()


def per_batch(fn, n_batches: int, epochs: int) -> tuple[float, float]:
    """Median µs per batch (wall, CPU) over ``epochs`` runs of ``fn`` (one epoch each)."""
    walls, cpus = [], []
    for _ in range(epochs):
        start = _clocks()
        fn()
        wall, cpu = _since(start)
        walls.append(wall / n_batches * 1e6)
        cpus.append(cpu / n_batches * 1e6)
    return float(np.median(walls)), float(np.median(cpus))


def measure_floor(case, data, threads: int, repeats: int, epochs: int) -> dict:
    batch, n_batches = case.batch_size, -(-len(data.X) // case.batch_size)
    full, fwbw = fitted("full", case, data, threads), fitted("fwbw", case, data, threads)
    full_data = full._prepare_data(full._spec, None, {full._spec.x_name: data.X}, None, data.y, None, None)[0]
    fwbw_data = fwbw._prepare_data(fwbw._spec, None, {fwbw._spec.x_name: data.X}, None, data.y, None, None)[0]
    lr = case.learning_rate
    runs = {
        "full floor": lambda: full_floor_epoch(full, data, batch),
        "full ortflow": lambda: full._train_rows(full_data, None, lr),
        "fwbw agent floor": lambda: fwbw_floor_epoch(fwbw, n_batches, batch, with_graphs=False),
        "fwbw floor": lambda: fwbw_floor_epoch(fwbw, n_batches, batch, with_graphs=True),
        "fwbw ortflow": lambda: fwbw._train_rows(fwbw_data, None, lr),
    }
    samples = {k: [] for k in runs}
    for r in range(repeats):
        keys = list(runs)
        for key in keys[r % len(keys):] + keys[: r % len(keys)]:
            samples[key].append(per_batch(runs[key], n_batches, epochs))
    out = {k: {"wall_us": float(np.median([w for w, _ in v])), "cpu_us": float(np.median([c for _, c in v]))}
           for k, v in samples.items()}
    for kind, floor in (("full", "full floor"), ("fwbw", "fwbw floor")):
        out[f"{kind} overhead"] = {clock: out[f"{kind} ortflow"][clock] - out[floor][clock]
                                   for clock in ("wall_us", "cpu_us")}
    return out


def measure_setup(case, data, threads: int, repeats: int) -> dict:
    def full_fit(cache, gradients: str, cached: bool):
        if not cached:
            cache.clear()
        return fitted("full", case, data, threads, gradients)

    fits = {"full, step graphs built": lambda: full_fit(STEP_GRAPHS, "ortflow", False),
            "full, step graphs cached": lambda: full_fit(STEP_GRAPHS, "ortflow", True),
            "full (onnxruntime's), artifacts generated": lambda: full_fit(TRAINING_ARTIFACTS, "onnxruntime", False),
            "full (onnxruntime's), artifacts cached": lambda: full_fit(TRAINING_ARTIFACTS, "onnxruntime", True),
            "fwbw": lambda: fitted("fwbw", case, data, threads)}
    for key in fits:
        fits[key]()  # warm the imports and the allocator, fill the caches
    samples = {k: [] for k in fits}
    for r in range(repeats):
        keys = list(fits)
        for key in keys[r % len(keys):] + keys[: r % len(keys)]:
            if key.endswith("cached"):
                fits[key]()  # make sure the graph is in the cache
            start = _clocks()
            trainer = fits[key]()
            wall, cpu = _since(start)
            epoch = trainer.history_[0]["time"]
            samples[key].append((wall * 1e3, cpu * 1e3, epoch * 1e3))
    return {k: {"fit_wall_ms": float(np.median([w for w, _, _ in v])),
                "fit_cpu_ms": float(np.median([c for _, c, _ in v])),
                "epoch_wall_ms": float(np.median([e for _, _, e in v]))} for k, v in samples.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--epochs", type=int, default=20, help="epochs per repeat (floor)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    case = next(c for c in default_cases() if c.key == "A")
    data = make_data(case)
    with warnings.catch_warnings(), quiet_ort_info():
        warnings.simplefilter("ignore")
        floor = measure_floor(case, data, args.threads, args.repeats, args.epochs)
        setup = measure_setup(case, data, args.threads, args.repeats)
    report = {"machine": machine_info(args.threads), "repeats": args.repeats, "floor": floor, "setup": setup}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "floor.json").write_text(json.dumps(report, indent=1))
    print(f"case A, {args.threads} thread(s), per batch of {case.batch_size} rows (median of {args.repeats}):")
    print("| path | wall µs | CPU µs |\n|---|---|---|")
    for key, v in floor.items():
        print(f"| {key} | {v['wall_us']:.1f} | {v['cpu_us']:.1f} |")
    print("\n| one-epoch fit on A | wall ms | CPU ms | of which the epoch, wall ms |\n|---|---|---|---|")
    for key, v in setup.items():
        print(f"| {key} | {v['fit_wall_ms']:.1f} | {v['fit_cpu_ms']:.1f} | {v['epoch_wall_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
