"""Measurements beside the engine tables: MLflow tracking cost, onnxruntime session settings, the command-line
pipeline's wall time and a cProfile of ortflow's training loop."""

from __future__ import annotations

import contextlib
import cProfile
import io
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .cases import Case, CaseData
from .engines import Skip, train, train_ortflow_full

ROOT = Path(__file__).resolve().parent.parent


def summarize(values: list[float]) -> dict:
    arr = np.asarray(values, dtype=float)
    return {"median": float(np.median(arr)), "min": float(arr.min()), "max": float(arr.max()), "n": len(arr)}


# --- MLflow ----------------------------------------------------------------------------------------------------------
def _callback_base():
    from ortflow.trainers.callbacks import Callback

    return Callback


def make_timer():
    """Two callbacks bracketing the others: ``begin`` goes first in the list, ``end`` last."""
    Callback = _callback_base()
    stamps = {}

    class Begin(Callback):
        def on_train_begin(self, trainer):
            stamps["begin"] = time.perf_counter()

    class End(Callback):
        def on_train_end(self, trainer):
            stamps["end"] = time.perf_counter()

    return Begin(), End(), stamps


def bench_mlflow_callback(mode: str):
    """The bench's minimal MLflow callback (used when pipelines/tracking/epoch_metrics.py offers none).

    ``sync``: ``mlflow.log_metrics(..., step=epoch)`` after every epoch (one database transaction each).
    ``async``: the same with ``synchronous=False`` (a background thread writes; flushed at the end).
    ``buffered``: metrics kept in memory and written with one ``log_batch`` at the end of training.
    """
    import mlflow
    from mlflow.entities import Metric

    Callback = _callback_base()

    class MlflowEpochLogger(Callback):
        def __init__(self):
            self.buffer = []

        def on_epoch_end(self, trainer, record):
            metrics = {k: float(record[k]) for k in ("train_loss", "learning_rate") if record.get(k) is not None}
            if mode == "buffered":
                stamp = int(time.time() * 1000)
                self.buffer += [Metric(k, v, stamp, record["epoch"]) for k, v in metrics.items()]
            else:
                mlflow.log_metrics(metrics, step=record["epoch"], synchronous=(mode == "sync"))

        def on_train_end(self, trainer):
            if mode == "buffered" and self.buffer:
                client = mlflow.MlflowClient()
                run_id = mlflow.active_run().info.run_id
                for i in range(0, len(self.buffer), 1000):
                    client.log_batch(run_id, metrics=self.buffer[i : i + 1000])
                self.buffer = []
            elif mode == "async":
                mlflow.flush_async_logging()

    return MlflowEpochLogger()


def pipeline_callback_factory(tmp: str):
    """A function returning the pipelines' epoch-metrics callback (pipelines/tracking/epoch_metrics.py) bound to the active
    run, or None when the pipelines do not offer one."""
    try:
        import importlib

        import mlflow

        tracking = importlib.import_module("pipelines.tracking")
        cls = tracking.MlflowMetricsCallback
        uri = mlflow.get_tracking_uri()
        client = tracking.RetryingClient(mlflow.MlflowClient(uri))
        exp = mlflow.get_experiment_by_name("bench")
        conn = tracking.Tracking(uri=uri, client=client, experiment_id=exp.experiment_id, experiment_name="bench",
                                 root=Path(tmp), retries=8)
    except Exception:  # noqa: BLE001 - not written yet, or its API changed
        return None

    def make():
        return cls(conn, mlflow.active_run().info.run_id)

    return make


def measure_mlflow(case: Case, data: CaseData, threads: int, repeats: int, log=print) -> dict:
    """Wall time of ortflow's full training with and without an MLflow callback (local sqlite store).

    ``loop_s`` spans the training loop (first epoch to the end of ``on_train_end``); ``total_s`` adds what the
    caller must wait for afterwards (``wait()`` of the pipelines' asynchronous callback)."""
    try:
        import mlflow
    except ImportError:
        return {"skipped": "mlflow is not installed"}
    modes = ["none", "sync", "async", "buffered"]
    samples = {}
    with tempfile.TemporaryDirectory(prefix="bench-mlflow-") as tmp:
        previous = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
        mlflow.set_experiment("bench")
        try:
            with mlflow.start_run():  # warm-up: creates the database, imports everything
                mlflow.log_metric("warmup", 1.0, step=0)
            make_pipeline_cb = pipeline_callback_factory(tmp)
            if make_pipeline_cb is not None:
                modes.append("pipelines")
            samples = {m: {"loop": [], "total": []} for m in modes}
            for r in range(repeats + 1):  # the first round is a warm-up
                for mode in modes[r % len(modes):] + modes[: r % len(modes)]:
                    begin, end, stamps = make_timer()
                    ctx = mlflow.start_run() if mode != "none" else contextlib.nullcontext()
                    with ctx:
                        cb = None
                        if mode == "pipelines":
                            cb = make_pipeline_cb()
                        elif mode != "none":
                            cb = bench_mlflow_callback(mode)
                        cbs = [begin] + ([cb] if cb is not None else []) + [end]
                        train_ortflow_full(case, data, case.epochs, threads, callbacks=cbs)
                        if mode == "pipelines":
                            cb.wait()
                        done = time.perf_counter()
                    if r:
                        samples[mode]["loop"].append(stamps["end"] - stamps["begin"])
                        samples[mode]["total"].append(done - stamps["begin"])
                if r:
                    log(f"  mlflow repeat {r}/{repeats}: " + ", ".join(
                        f"{m}={v['total'][-1]:.3f}s" for m, v in samples.items()))
        finally:
            mlflow.set_tracking_uri(previous)
    none = np.asarray(samples["none"]["total"])
    out = {"case": case.key, "epochs": case.epochs,
           "callbacks": {"sync": "bench: mlflow.log_metrics per epoch",
                         "async": "bench: mlflow.log_metrics(synchronous=False) per epoch, flushed at the end",
                         "buffered": "bench: one MlflowClient.log_batch at the end of training",
                         "pipelines": "pipelines.tracking.MlflowMetricsCallback (buffered, async log_batch, wait())"},
           "modes": {}}
    for mode in modes:
        total = np.asarray(samples[mode]["total"])
        loop = np.asarray(samples[mode]["loop"])
        paired = total / none - 1.0
        added = float(np.median(total - none) / case.epochs * 1e3)
        out["modes"][mode] = {
            "loop_s": summarize(loop.tolist()),
            "total_s": summarize(total.tolist()),
            "overhead": float(np.median(paired)) if mode != "none" else 0.0,
            "overhead_min": float(paired.min()),
            "overhead_max": float(paired.max()),
            "loop_overhead": float(np.median(loop / np.asarray(samples["none"]["loop"]) - 1.0)),
            "ms_per_epoch_added": added,
            # the shortest epoch for which this logging stays within 5%
            "breakeven_epoch_ms": max(added, 0.0) / 0.05,
        }
    return out


# --- onnxruntime session settings -------------------------------------------------------------------------------
ORT_SETTINGS = {
    "default (threads=T)": {},
    "threads=1": {"threads": 1},
    "no spinning": {"session.intra_op.allow_spinning": "0"},
    "opt=ORT_ENABLE_BASIC": {"graph_optimization_level": "ORT_ENABLE_BASIC"},
    "opt=ORT_DISABLE_ALL": {"graph_optimization_level": "ORT_DISABLE_ALL"},
    "no mem pattern": {"enable_mem_pattern": False},
    "no cpu arena": {"enable_cpu_mem_arena": False},
    "threads=1, no spinning": {"threads": 1, "session.intra_op.allow_spinning": "0"},
    "graph: Relu as x*(x>0) (ortflow)": {"relu_as_mask": True},
}


def measure_ort_settings(case: Case, data: CaseData, threads: int, repeats: int, epochs: int, log=print,
                         with_torch: bool = True) -> dict:
    """The raw loop under several SessionOptions (interleaved), torch at 1 and T threads beside it."""
    variants = {}
    for label, settings in ORT_SETTINGS.items():
        settings = dict(settings)
        t = settings.pop("threads", threads)
        variants[label] = ("raw", t, settings)
    variants["raw, capi (pybind objects)"] = ("raw-capi", threads, {})
    if with_torch:
        variants["torch threads=T"] = ("torch", threads, {})
        if threads != 1:
            variants["torch threads=1"] = ("torch", 1, {})
    samples = {k: [] for k in variants}
    losses = {}
    labels = list(variants)
    for r in range(repeats):
        for label in labels[r % len(labels):] + labels[: r % len(labels)]:
            engine, t, settings = variants[label]
            try:
                if engine == "raw":
                    run = train("raw", case, data, epochs, t, settings=settings)
                elif engine == "raw-capi":
                    run = train("raw", case, data, epochs, t, capi=True)
                else:
                    run = train(engine, case, data, epochs, t)
            except Skip as exc:
                samples[label] = None
                losses[label] = str(exc)
                continue
            if samples[label] is not None:
                samples[label].append(_per_epoch(run.epoch_times))
                losses[label] = run.losses[-1]
        log(f"  ort settings {case.key} repeat {r + 1}/{repeats} done")
    base = samples["default (threads=T)"]
    out = {"case": case.key, "threads": threads, "epochs": epochs, "variants": {}}
    for label, vals in samples.items():
        if not vals:
            out["variants"][label] = {"skipped": losses.get(label)}
            continue
        out["variants"][label] = {
            "ms_per_epoch": summarize([v * 1e3 for v in vals]),
            "ratio_to_default": float(np.median(np.asarray(vals) / np.asarray(base))),
            "final_loss": losses.get(label),
        }
    return out


def _per_epoch(times: list[float]) -> float:
    """One number per run: the median epoch, the first (warm-up) epoch left out when there are 3 or more."""
    times = times[1:] if len(times) >= 3 else times
    return float(np.median(times))


# --- pipeline ------------------------------------------------------------------------------------------------------
def measure_pipeline(timeout: int = 600) -> dict:
    """Wall time of ``python -m pipelines.main`` (defaults), run in a temporary folder (its own mlflow.db)."""
    if not (ROOT / "pipelines" / "main.py").exists() and not (ROOT / "pipelines" / "__main__.py").exists():
        return {"skipped": "pipelines/main.py does not exist yet"}
    # a parent that used mlflow (measure_mlflow) leaves MLFLOW_EXPERIMENT_ID & co. in the environment: the
    # pipeline must start from a clean one, like a user's shell
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        begin = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "pipelines.main"], cwd=tmp, env=env, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"command": "python -m pipelines.main", "error": f"timed out after {timeout} s"}
        wall = time.perf_counter() - begin
    out = {"command": "python -m pipelines.main", "wall_s": wall, "returncode": proc.returncode}
    if proc.returncode:
        out["error"] = (proc.stderr or proc.stdout)[-2000:]
    return out


# --- profiling -----------------------------------------------------------------------------------------------------
def profile_loops(case: Case, data: CaseData, threads: int, epochs: int, folder: Path) -> dict:
    """cProfile of ortflow's full trainer and of the raw loop on the same case; top functions by own time."""
    out = {}
    for engine in ("ortflow-full", "raw", "ortflow-fwbw"):
        prof = cProfile.Profile()
        try:
            train(engine, case, data, 1, threads)  # warm-up: first-use imports stay out of the profile
            prof.enable()
            train(engine, case, data, epochs, threads)
            prof.disable()
        except Skip as exc:
            prof.disable()
            out[engine] = {"skipped": str(exc)}
            continue
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text).strip_dirs().sort_stats("tottime")
        stats.print_stats(25)
        path = folder / f"profile-{case.key}-{engine}.txt"
        path.write_text(text.getvalue())
        top = []
        for (file, line, func), (cc, nc, tt, ct, _) in sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:12]:
            top.append({"function": f"{file}:{line}({func})", "calls": nc, "tottime_s": tt, "cumtime_s": ct})
        out[engine] = {"file": str(path), "top": top}
    return out
