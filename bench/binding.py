"""What binding once saves in the forward-backward trainer: ``python -m bench.binding [--repeats 7]``.

On case A (MLP (50,10), 100 features, batch 15) the trainer binds every buffer of a batch size once: the feed
vector of ``run_forward`` (per weight parity), its fetch vector, the IOBinding of the loss graph and the feed
vector of ``run_backward``. This times, per batch, the loss graph run on its stored binding against the same run
on a binding built for the call, and the cost of building the vectors a batch would otherwise need, next to
the trainer's whole per-batch time. Median over repeats of the mean over ``--calls`` calls, in microseconds.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import ortflow
from ortflow._ort import OrtValueVector

from .cases import default_cases, make_data
from .engines import prediction_graph


def _per_call_us(fn, calls: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        begin = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - begin) / calls * 1e6)
    return float(np.median(samples))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.binding", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)

    case = next(c for c in default_cases() if c.key == "A")
    data = make_data(case)
    clock = []

    class Clock(ortflow.Callback):
        def on_epoch_end(self, trainer, record):
            clock.append(time.perf_counter())

    trainer = ortflow.OrtGradientForwardBackwardOptimizer(
        prediction_graph(data), max_iter=args.repeats + 1, batch_size=case.batch_size,
        learning_rate=ortflow.LearningRateSGD(eta0=case.learning_rate, learning_rate="constant"),
        shuffle=False, n_threads=args.threads, callbacks=[Clock()])
    begin = time.perf_counter()
    trainer.fit(data.X, data.y)
    n_batches = -(-len(data.X) // case.batch_size)
    epochs = np.diff([begin, *clock])[1:]  # the first epoch builds the batch buffers
    batch_us = float(np.median(epochs)) / n_batches * 1e6

    batch = trainer._rt_batches[case.batch_size][0]  # (the batch, its host arrays)
    loss_fn, fb, rate = trainer._rt_runtime.loss_fn, trainer._rt_runtime.fb, trainer._rt_runtime.update
    run = loss_fn._sess.run_with_iobinding
    inputs, outputs = [batch.prediction, batch.y, batch.w], [batch.loss, batch.grad]
    bound = _per_call_us(lambda: run(batch.loss_binding, None), args.calls, args.repeats)
    rebound = _per_call_us(lambda: run(loss_fn.bind(inputs, outputs), None), args.calls, args.repeats)
    values = {name: rate.buffers_["weight", name][rate.parity_] for name in trainer.weights_to_train_}
    values.update(batch.xs)

    def vectors():
        fb.feed_vector(values)
        fetches, bw_feeds = OrtValueVector(), OrtValueVector()
        fetches.push_back(batch.prediction.c)
        bw_feeds.push_back(batch.grad.c)

    build = _per_call_us(vectors, args.calls, args.repeats)
    saved = rebound - bound + build
    print(f"case A, fwbw, batch {case.batch_size}, {args.threads} thread(s), median of {args.repeats} x "
          f"{args.calls} calls")
    print("| per batch | µs |\n|---|---|")
    print(f"| whole batch in the trainer (forward, loss, backward, update) | {batch_us:.1f} |")
    print(f"| loss graph on its stored binding | {bound:.2f} |")
    print(f"| loss graph on a binding built for the call | {rebound:.2f} |")
    print(f"| building the forward feeds/fetches and backward feeds | {build:.2f} |")
    print(f"| saved by binding once | {saved:.2f} ({saved / (batch_us + saved):.1%} of an unbound batch) |")


if __name__ == "__main__":
    main()
