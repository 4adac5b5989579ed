"""ms/epoch of ortflow's own standard-ONNX SGD step graph (ortflow.autodiff.training_step run by
TrainingStepRunner) against full training (OrtGradientOptimizer), side by side on one case, interleaved.
Both wall time and CPU time (process_time: less sensitive to a machine shared with other jobs) per epoch.

    python -m bench.own_gradient_step [--case A] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import ortflow
from ortflow.autodiff import TrainingStepRunner, training_step
from ortflow.callbacks import Callback

from .cases import default_cases, make_data
from .engines import loss_graph, session_options


class _Clock(Callback):
    def on_train_begin(self, trainer):
        self.stamps = [(time.perf_counter(), time.process_time())]

    def on_epoch_end(self, trainer, record):
        self.stamps.append((time.perf_counter(), time.process_time()))


def full(case, data, threads: int) -> tuple[np.ndarray, float]:
    clock = _Clock()
    trainer = ortflow.OrtGradientOptimizer(
        loss_graph(case, data), max_iter=case.epochs, batch_size=case.batch_size, learning_rate=case.learning_rate,
        lr_schedule="constant", shuffle=False, n_threads=threads, callbacks=[clock])
    trainer.fit(data.X, data.y)
    return np.diff(np.array(clock.stamps), axis=0), float(trainer.train_losses_[-1])


def own_step(case, data, threads: int) -> tuple[np.ndarray, float]:
    loss = loss_graph(case, data)
    runner = TrainingStepRunner(training_step(loss), ortflow.get_initializers(loss), session_options(threads))
    stamps = [(time.perf_counter(), time.process_time())]
    for _ in range(case.epochs):
        losses = runner.epoch([data.X, data.y], case.batch_size, case.learning_rate)
        stamps.append((time.perf_counter(), time.process_time()))
    sizes = np.diff(np.r_[np.arange(0, len(data.X), case.batch_size), len(data.X)])
    return np.diff(np.array(stamps), axis=0), float(np.average(losses, weights=sizes))  # the trainers' epoch loss


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", default="A")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    case = next(c for c in default_cases() if c.key == args.case)
    data = make_data(case)
    engines = {"ortflow-full": full, "own-step": own_step}
    results = {name: [] for name in engines}
    for _ in range(args.repeats):
        for name, run in engines.items():
            results[name].append(run(case, data, args.threads))
    print(f"case {case.key}, {args.threads} thread(s), {args.repeats} interleaved repeats of {case.epochs} epochs")
    for name, runs in results.items():
        wall = [np.median(t[:, 0]) * 1e3 for t, _ in runs]
        cpu = [np.median(t[:, 1]) * 1e3 for t, _ in runs]
        print(f"{name:13s} ms/epoch (median over repeats of the median epoch): wall {np.median(wall):.3f} "
              f"[{', '.join(f'{m:.2f}' for m in wall)}], cpu {np.median(cpu):.3f} "
              f"[{', '.join(f'{m:.2f}' for m in cpu)}]; last epoch loss {runs[-1][1]:.6f}")


if __name__ == "__main__":
    main()
