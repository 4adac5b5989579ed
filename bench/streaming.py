"""Training from a Parquet table larger than memory: peak memory and rows per second.

The bench writes a table of ``--rows`` rows x 50 float32 features (plus the target), in row groups of 65,536 rows,
then measures, each in a fresh process (its own peak resident set, ``VmHWM``):

- ``stream``: ``OrtGradientForwardBackwardOptimizer.fit(ParquetSource(folder))``, one epoch, shuffled (row groups
  in random order, rows within a 262,144-row buffer), chunks read ahead on a background thread;
- ``memory``: the same trainer on a sample that fits in memory (``--sample`` rows, read whole first; the time
  counts the epoch only), rows per second;
- ``sklearn``: ``SGDRegressor.partial_fit`` over the same Parquet batches (one call per 1,024-row batch, as a user's
  loop would), rows per second.

    python -m bench.streaming --rows 10000000 --folder /tmp/ortflow-stream
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


def write_table(folder: str, rows: int, seed: int = 0) -> None:
    """``rows`` rows in one Parquet file, written 1e6 rows at a time (memory bounded while writing too)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "table.parquet")
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
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table, row_group_size=ROW_GROUP)
    writer.close()


def _start_graph():
    from sklearn.linear_model import LinearRegression

    import ortflow

    rng = np.random.default_rng(1)
    X = rng.normal(size=(100, FEATURES)).astype(np.float32)
    return ortflow.to_onnx(LinearRegression().fit(X, rng.normal(size=100)), X)


def _trainer():
    import ortflow

    return ortflow.OrtGradientForwardBackwardOptimizer(_start_graph(), learning_loss="squared_error", max_iter=1,
                                                       batch_size=BATCH, learning_rate=1e-3, random_state=0)


def child(engine: str, folder: str, sample: int) -> dict:
    from bench.memory import peak_rss_bytes, rss_bytes
    from ortflow.sources import ParquetSource

    path = os.path.join(folder, "table.parquet")
    base = rss_bytes()
    if engine == "stream":
        source = ParquetSource(path, target="y", buffer_rows=4 * ROW_GROUP)
        trainer = _trainer()
        begin = time.perf_counter()
        trainer.fit(source)
        seconds, rows = time.perf_counter() - begin, source.n_rows
    elif engine == "memory":
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path).read_row_groups(list(range(-(-sample // ROW_GROUP)))).slice(0, sample)
        X = np.stack([table.column(f"x{i}").to_numpy() for i in range(FEATURES)], axis=1).astype(np.float32)
        y = table.column("y").to_numpy().astype(np.float32)
        del table
        trainer = _trainer()
        begin = time.perf_counter()
        trainer.fit(X, y)
        seconds, rows = time.perf_counter() - begin, len(X)
    else:
        import warnings

        import pyarrow.parquet as pq
        from sklearn.linear_model import SGDRegressor

        model = SGDRegressor(learning_rate="constant", eta0=1e-3, random_state=0)
        names = [f"x{i}" for i in range(FEATURES)]
        rows, begin = 0, time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH, columns=[*names, "y"]):
                X = np.stack([batch.column(i).to_numpy() for i in range(FEATURES)], axis=1)
                model.partial_fit(X, batch.column(FEATURES).to_numpy())
                rows += len(X)
                if rows >= sample:
                    break
        seconds = time.perf_counter() - begin
    return {"engine": engine, "rows": rows, "seconds": seconds, "rows_per_second": rows / seconds,
            "peak_rss_mb": peak_rss_bytes() / 2**20, "base_rss_mb": base / 2**20}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--sample", type=int, default=1_000_000, help="rows of the in-memory and sklearn runs")
    parser.add_argument("--folder", default="/tmp/ortflow-stream")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.sample)))
        return 0
    begin = time.perf_counter()
    write_table(args.folder, args.rows)
    print(f"table: {args.rows:,} rows x {FEATURES} float32 features, written in {time.perf_counter() - begin:.0f} s",
          flush=True)
    results: dict[str, list[dict]] = {}
    for _ in range(args.repeats):  # interleaved, one fresh process each
        for engine in ("stream", "memory", "sklearn"):
            out = subprocess.run([sys.executable, "-m", "bench.streaming", "--sample", str(args.sample), "--child",
                                  engine, args.folder], capture_output=True, text=True, check=True)
            results.setdefault(engine, []).append(json.loads(out.stdout.strip().splitlines()[-1]))
    summary = {e: {k: float(np.median([r[k] for r in runs])) for k in ("rows_per_second", "peak_rss_mb", "rows")}
               for e, runs in results.items()}
    for engine, s in summary.items():
        print(f"{engine:8s} {s['rows']:>12,.0f} rows  {s['rows_per_second']:>12,.0f} rows/s  "
              f"peak RSS {s['peak_rss_mb']:,.0f} MB")
    stream, memory, sk = (summary[e]["rows_per_second"] for e in ("stream", "memory", "sklearn"))
    print(f"streamed / in-memory throughput: {stream / memory:.2f}; streamed / sklearn partial_fit: {stream / sk:.1f}")
    print(json.dumps({"summary": summary, "runs": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
