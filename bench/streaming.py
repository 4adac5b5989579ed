"""Training from a Parquet table larger than memory: peak memory and rows per second.

The bench writes a table of ``--rows`` rows x 50 float32 features (plus the target), in row groups of 65,536 rows
(``--compression``: Parquet's codec, snappy by default as pyarrow writes it; ``none`` for an uncompressed file),
then measures, for each model of ``--models`` and each in a fresh process (its own peak resident set, ``VmHWM``):

- ``stream``: ``OrtGradientForwardBackwardOptimizer.fit(ParquetSource(folder))``, one epoch, shuffled (row groups
  in random order, rows within a 262,144-row buffer), chunks read ahead on a background thread;
- ``memory``: the same trainer on a sample that fits in memory (``--sample`` rows, read whole first; the time
  counts the fit only), rows per second;
- ``memory-sleeping``: the same with ``spinning=False`` (onnxruntime's idle threads sleep, as they do in a streamed
  fit): the in-memory side of the comparison with the one setting a streamed fit changes (for a model trained on
  one thread, ``linear``, it changes nothing);
- ``sklearn``: scikit-learn's ``partial_fit`` over the same Parquet batches (one call per 1,024-row batch, as a
  user's loop would), rows per second: ``SGDRegressor`` for ``linear``, ``MLPRegressor`` for ``mlp``.

The models: ``linear`` (51 weights: about 0.2 µs of training per row, less than decoding a row costs) and ``mlp``
(one hidden layer of 64 ReLU units, 3,329 weights: training costs more per row than reading).

    python -m bench.streaming --rows 10000000 --folder /tmp/ortflow-stream --models linear,mlp
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

FEATURES = 50
ROW_GROUP = 65_536
BATCH = 1024


MODELS = ("linear", "mlp")
ENGINES = ("stream", "memory", "memory-sleeping", "sklearn")


def table_path(folder: str, compression: str) -> str:
    return os.path.join(folder, f"table-{compression}.parquet")


def write_table(folder: str, rows: int, compression: str = "snappy", seed: int = 0) -> None:
    """``rows`` rows in one Parquet file, written 1e6 rows at a time (memory bounded while writing too)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    path = table_path(folder, compression)
    if os.path.exists(path) and pq.ParquetFile(path).metadata.num_rows == rows:
        return
    rng = np.random.default_rng(seed)
    coef = rng.normal(size=FEATURES).astype(np.float32)
    names = [f"x{i}" for i in range(FEATURES)]
    writer = None
    for start in range(0, rows, 1_000_000):
        n = min(1_000_000, rows - start)
        X = rng.normal(size=(n, FEATURES)).astype(np.float32)
        y = X @ coef + np.float32(0.1) * rng.normal(size=n).astype(np.float32)
        table = pa.table({**{name: X[:, i] for i, name in enumerate(names)}, "y": y})
        writer = writer or pq.ParquetWriter(path, table.schema, compression=compression)
        writer.write_table(table, row_group_size=ROW_GROUP)
    writer.close()


def _sklearn_model(model: str):
    from sklearn.linear_model import SGDRegressor
    from sklearn.neural_network import MLPRegressor

    if model == "linear":
        return SGDRegressor(learning_rate="constant", eta0=1e-3, random_state=0)
    return MLPRegressor(hidden_layer_sizes=(64,), solver="sgd", learning_rate_init=1e-3, batch_size=BATCH,
                        random_state=0)


def _start_graph(model: str):
    import warnings

    import ortflow

    rng = np.random.default_rng(1)
    X = rng.normal(size=(100, FEATURES)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a start, not a converged fit
        start = _sklearn_model(model).fit(X, rng.normal(size=100))
    return ortflow.to_onnx(start, X)


def _trainer(model: str, **settings):
    import ortflow

    return ortflow.OrtGradientForwardBackwardOptimizer(_start_graph(model), learning_loss="squared_error",
                                                       max_iter=1, batch_size=BATCH, learning_rate=1e-3,
                                                       random_state=0, **settings)


def child(engine: str, model: str, path: str, sample: int) -> dict:
    from bench.memory import peak_rss_bytes, rss_bytes
    from ortflow.data.sources import ParquetSource

    base = rss_bytes()
    if engine == "stream":
        source = ParquetSource(path, target="y", buffer_rows=4 * ROW_GROUP)
        trainer = _trainer(model)
        begin = time.perf_counter()
        trainer.fit(source)
        seconds, rows = time.perf_counter() - begin, source.n_rows
    elif engine in ("memory", "memory-sleeping"):
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path).read_row_groups(list(range(-(-sample // ROW_GROUP)))).slice(0, sample)
        X = np.stack([table.column(f"x{i}").to_numpy() for i in range(FEATURES)], axis=1).astype(np.float32)
        y = table.column("y").to_numpy().astype(np.float32)
        del table
        trainer = _trainer(model, **({"spinning": False} if engine == "memory-sleeping" else {}))
        begin = time.perf_counter()
        trainer.fit(X, y)
        seconds, rows = time.perf_counter() - begin, len(X)
    else:
        import warnings

        import pyarrow.parquet as pq

        estimator = _sklearn_model(model)
        names = [f"x{i}" for i in range(FEATURES)]
        rows, begin = 0, time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH, columns=[*names, "y"]):
                X = np.stack([batch.column(i).to_numpy() for i in range(FEATURES)], axis=1)
                estimator.partial_fit(X, batch.column(FEATURES).to_numpy())
                rows += len(X)
                if rows >= sample:
                    break
        seconds = time.perf_counter() - begin
    return {"engine": engine, "model": model, "rows": rows, "seconds": seconds, "rows_per_second": rows / seconds,
            "peak_rss_mb": peak_rss_bytes() / 2**20, "base_rss_mb": base / 2**20}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--sample", type=int, default=1_000_000, help="rows of the in-memory and sklearn runs")
    parser.add_argument("--folder", default="/tmp/ortflow-stream")
    parser.add_argument("--compression", default="snappy", help="the Parquet codec the table is written with")
    parser.add_argument("--models", default="linear", help=f"comma-separated, among {', '.join(MODELS)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.sample)))
        return 0
    models = args.models.split(",")
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose among {list(MODELS)}")
    begin = time.perf_counter()
    write_table(args.folder, args.rows, args.compression)
    path = table_path(args.folder, args.compression)
    print(f"table: {args.rows:,} rows x {FEATURES} float32 features, {os.path.getsize(path) / 2**30:.1f} GiB "
          f"({args.compression}), written in {time.perf_counter() - begin:.0f} s", flush=True)
    results: dict[str, list[dict]] = {}
    for _ in range(args.repeats):  # interleaved, one fresh process each
        for model in models:
            for engine in ENGINES:
                out = subprocess.run([sys.executable, "-m", "bench.streaming", "--sample", str(args.sample),
                                      "--child", engine, model, path], capture_output=True, text=True, check=True)
                results.setdefault(f"{model}/{engine}", []).append(json.loads(out.stdout.strip().splitlines()[-1]))
    summary = {key: {k: float(np.median([r[k] for r in runs])) for k in ("rows_per_second", "peak_rss_mb", "rows")}
               for key, runs in results.items()}
    for key, s in summary.items():
        print(f"{key:22s} {s['rows']:>12,.0f} rows  {s['rows_per_second']:>12,.0f} rows/s  "
              f"peak RSS {s['peak_rss_mb']:,.0f} MB")
    for model in models:
        stream, memory, sleeping, sk = (summary[f"{model}/{e}"]["rows_per_second"] for e in ENGINES)
        print(f"{model}: streamed / in-memory throughput {stream / memory:.2f} ({stream / sleeping:.2f} against "
              f"in memory with idle threads sleeping); streamed / scikit-learn partial_fit {stream / sk:.1f}")
    print(json.dumps({"summary": summary, "runs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
