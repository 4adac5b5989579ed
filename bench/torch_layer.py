"""Per-batch training steps of the ONNX layer in torch against the same model all in torch.

``python -m bench.torch_layer [--cases A,D-wide] [--threads 1,2] [--rounds 5] [--steps 200]``

Each round builds both models afresh from the case's initial weights and times ``steps`` consecutive training
steps of each (``zero_grad``, MSE loss, ``backward``, ``torch.optim.SGD.step`` over the case's batches in order),
the two engines in alternation, at the same thread count: ``torch.set_num_threads``, which the layer follows by
default (``OnnxModule(n_threads=None)``: torch's count, one onnxruntime thread for a batch too small to split, as
torch does not split small ops either). It prints the 10th
percentile and the median of the step times. On a machine shared with other jobs the epoch times of
``python -m bench.run`` swing by 2-10x from one repeat to the next; the low percentile of many single steps is the
figure those jobs distort least.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from .cases import default_cases, make_data
from .engines import prediction_graph, torch_sequential

ENGINES = ("torch", "ortflow-torch")


def step_times(model, case, data, steps: int) -> np.ndarray:
    """Seconds of each of ``steps`` training steps over the case's batches, in order (wrapping around)."""
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=case.learning_rate)
    loss_fn = torch.nn.MSELoss()
    X, y = torch.from_numpy(data.X), torch.from_numpy(data.y)
    starts = list(range(0, len(X) - case.batch_size + 1, case.batch_size))  # full batches only
    times = np.empty(steps)
    for i in range(steps):
        rows = slice(starts[i % len(starts)], starts[i % len(starts)] + case.batch_size)
        begin = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(X[rows]), y[rows])
        loss.backward()
        optimizer.step()
        times[i] = time.perf_counter() - begin
    return times


def build(engine: str, case, data, threads: int):
    import torch

    from ortflow.torch import OnnxModule

    torch.set_num_threads(threads)
    if engine == "torch":
        return torch_sequential(case, data)
    return OnnxModule(prediction_graph(data))


def measure(cases: list[str], threads: list[int], rounds: int, steps: int) -> list[dict]:
    """One row per (case, threads): percentiles of the step times of each engine and their ratios."""
    rows = []
    for case in [c for c in default_cases() if c.key in cases]:
        data = make_data(case)
        for t in threads:
            times = {engine: [] for engine in ENGINES}
            for r in range(rounds):
                for engine in ENGINES[r % 2:] + ENGINES[: r % 2]:
                    model = build(engine, case, data, t)
                    step_times(model, case, data, 5)  # warm-up: sessions, static graphs, allocators
                    times[engine].append(step_times(model, case, data, steps))
            stats = {e: np.concatenate(v) for e, v in times.items()}
            row = {"case": case.key, "batch": case.batch_size, "threads": t, "steps": rounds * steps}
            for engine, values in stats.items():
                row[f"{engine} p10 us"] = float(np.percentile(values, 10) * 1e6)
                row[f"{engine} median us"] = float(np.median(values) * 1e6)
            for q in ("p10", "median"):
                row[f"ratio {q}"] = row[f"ortflow-torch {q} us"] / row[f"torch {q} us"]
            rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    head = ("| case | batch | threads | all torch p10 / median µs | ONNX layer p10 / median µs | layer / torch p10 "
            "| layer / torch median |\n|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['case']} | {r['batch']} | {r['threads']} | {r['torch p10 us']:.0f} / "
                     f"{r['torch median us']:.0f} | {r['ortflow-torch p10 us']:.0f} / "
                     f"{r['ortflow-torch median us']:.0f} | {r['ratio p10']:.2f} | {r['ratio median']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.torch_layer", description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="A,D-wide")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = measure(args.cases.split(","), [int(t) for t in args.threads.split(",")], args.rounds, args.steps)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
