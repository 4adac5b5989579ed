"""ms/epoch of full training (OrtGradientOptimizer) on ortflow's own training-step graph (gradients='ortflow')
against onnxruntime-training's artifacts (gradients='onnxruntime', training build only), interleaved, on the
installed backend. Wall time and CPU time (process_time: less sensitive to a machine shared with other jobs) per
epoch; run it in each environment (``.venv`` for the training build, ``.venv313`` for the plain onnxruntime) to
compare the backends.

    python -m bench.own_gradient_step [--cases A,D-wide] [--repeats 5] [--threads 1] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

import ortflow
from ortflow._ort import runtime_name
from ortflow.trainers.callbacks import Callback

from .cases import default_cases, make_data
from .engines import loss_graph, quiet_ort_info


class _Clock(Callback):
    def on_train_begin(self, trainer):
        self.stamps = [(time.perf_counter(), time.process_time())]

    def on_epoch_end(self, trainer, record):
        self.stamps.append((time.perf_counter(), time.process_time()))


def full(case, data, threads: int, gradients: str) -> tuple[np.ndarray, float]:
    """Per-epoch (wall, cpu) seconds and the last epoch's loss of one fit."""
    clock = _Clock()
    trainer = ortflow.OrtGradientOptimizer(
        loss_graph(case, data), max_iter=case.epochs, batch_size=case.batch_size, learning_rate=case.learning_rate,
        lr_schedule="constant", shuffle=False, n_threads=threads, callbacks=[clock], gradients=gradients)
    with quiet_ort_info():
        trainer.fit(data.X, data.y)
    assert trainer.gradients_ == gradients
    return np.diff(np.array(clock.stamps), axis=0), float(trainer.train_losses_[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="A,D-wide")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="D-wide on 20,000 rows")
    parser.add_argument("--json", default=None, help="append one JSON line per case and engine to this file")
    args = parser.parse_args(argv)
    engines = ["ortflow"] + (["onnxruntime"] if ortflow.backend() == "training" else [])
    for key in args.cases.split(","):
        case = next(c for c in default_cases(quick=args.quick) if c.key == key)
        data = make_data(case)
        results = {name: [] for name in engines}
        for _ in range(args.repeats):
            for name in engines:
                results[name].append(full(case, data, args.threads, name))
        print(f"{runtime_name()}, Python {platform.python_version()}: case {case.key} ({case.n_train} rows, batch "
              f"{case.batch_size}), {args.threads} thread(s), {args.repeats} interleaved repeats of {case.epochs} "
              "epochs")
        for name, runs in results.items():
            wall = [float(np.median(t[:, 0]) * 1e3) for t, _ in runs]
            cpu = [float(np.median(t[:, 1]) * 1e3) for t, _ in runs]
            print(f"  gradients={name:12s} ms/epoch (median over repeats of the median epoch): wall "
                  f"{np.median(wall):.3f} [{', '.join(f'{m:.2f}' for m in wall)}], cpu {np.median(cpu):.3f}; "
                  f"last epoch loss {runs[-1][1]:.6f}")
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({"runtime": runtime_name(), "python": platform.python_version(),
                                        "case": case.key, "gradients": name, "threads": args.threads,
                                        "wall_ms": wall, "cpu_ms": cpu, "loss": runs[-1][1]}) + "\n")


if __name__ == "__main__":
    main()
