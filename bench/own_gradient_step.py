"""ms/epoch of ortflow's own standard-ONNX SGD step graph (ortflow.autodiff.training_step run by
TrainingStepRunner) against full training (OrtGradientOptimizer), side by side on one case, interleaved.

    python -m bench.own_gradient_step [--case A] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import ortflow
from ortflow.autodiff import TrainingStepRunner, training_step

from .cases import default_cases, make_data
from .engines import loss_graph, session_options, train_ortflow_full


def own_step(case, data, epochs: int, threads: int) -> tuple[list[float], float]:
    loss = loss_graph(case, data)
    runner = TrainingStepRunner(training_step(loss), ortflow.get_initializers(loss), session_options(threads))
    times, losses = [], None
    for _ in range(epochs):
        begin = time.perf_counter()
        losses = runner.epoch([data.X, data.y], case.batch_size, case.learning_rate)
        times.append(time.perf_counter() - begin)
    return times, float(np.mean(losses))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", default="A")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    case = next(c for c in default_cases() if c.key == args.case)
    data = make_data(case)
    results = {"ortflow-full": [], "own-step": []}
    for _ in range(args.repeats):
        run = train_ortflow_full(case, data, case.epochs, args.threads)
        results["ortflow-full"].append((np.median(run.epoch_times) * 1e3, run.losses[-1]))
        times, last = own_step(case, data, case.epochs, args.threads)
        results["own-step"].append((np.median(times) * 1e3, last))
    for name, values in results.items():
        ms = [v[0] for v in values]
        print(f"{name:13s} ms/epoch median of repeats {np.median(ms):.3f} (each {', '.join(f'{m:.3f}' for m in ms)}); "
              f"last epoch loss {values[-1][1]:.6f}")


if __name__ == "__main__":
    main()
