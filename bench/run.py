"""The benchmark suite: ``python -m bench.run [--quick]`` (or ``make bench``).

Every case trains the same model with each engine (see :mod:`bench.cases`), engines in alternation, the whole
round repeated (5 times, 3 with ``--quick``), so slow drifts of the machine hit all engines alike. Results go to
``bench/results/`` (JSON + Markdown) and, unless ``--no-docs``, into ``docs/PERFORMANCE.md`` and ``docs/*.png``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

import ortflow

from . import extras, report
from .cases import ENGINES, Case, default_cases, make_data
from .engines import Skip, available, train

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 repeats, smaller big sizes (a few minutes)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes and epochs (smoke test; timings meaningless)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 5, --quick 3)")
    p.add_argument("--threads", type=int, default=None, help="threads for every engine (default: all cores)")
    p.add_argument("--cases", default=None, help="comma-separated case keys (A,B,C,D-1e3,...,D-wide; D = all D-*)")
    p.add_argument("--engines", default=None, help=f"comma-separated subset of {','.join(ENGINES)}")
    p.add_argument("--out", default=str(RESULTS), help="folder for the JSON/Markdown results")
    p.add_argument("--no-docs", action="store_true", help="do not write docs/PERFORMANCE.md and docs/*.png")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--memory-engines", default=None, help="comma-separated engines measured for memory (default all)")
    p.add_argument("--no-mlflow", action="store_true", help="skip the MLflow tracking cost")
    p.add_argument("--no-pipeline", action="store_true", help="skip the wall time of python -m pipelines.main")
    p.add_argument("--no-ort-settings", action="store_true", help="skip the SessionOptions sweep")
    p.add_argument("--profile", action="store_true", help="cProfile ortflow's loop and the raw loop on case A")
    return p.parse_args(argv)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def machine_info(threads: int) -> dict:
    import sklearn

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "threads_used": threads,
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "versions": {"numpy": np.__version__, "scikit-learn": sklearn.__version__},
        "thread_settings": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                           "OPENBLAS_NUM_THREADS") if os.environ.get(k)},
    }
    try:
        import psutil

        info["physical_cores"] = psutil.cpu_count(logical=False)
        info["memory_gb"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    for mod in ("onnxruntime", "onnx", "torch", "mlflow", "ortflow", "skl2onnx"):
        try:
            info["versions"][mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - optional
            info["versions"][mod] = None
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [{k: d.get(k) for k in ("internal_api", "num_threads", "version")} for d in threadpool_info()]
    except ImportError:
        pass
    info["thread_settings"]["onnxruntime intra_op_num_threads"] = threads
    info["thread_settings"]["torch.set_num_threads"] = threads
    info["thread_settings"]["scikit-learn (threadpoolctl limit)"] = threads
    return info


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or "unknown"


def per_repeat(times: list[float]) -> float:
    """One number per run: the median epoch, leaving out the first (warm-up) epoch when there are 3 or more."""
    times = times[1:] if len(times) >= 3 else times
    return float(np.median(times))


def run_case(case: Case, args, threads: int, engines_filter) -> dict:
    log(f"case {case.key}: {case.title}")
    t0 = time.perf_counter()
    data = make_data(case)
    engines, skipped = [], {}
    for name in case.engines:
        if engines_filter and name not in engines_filter:
            continue
        reason = available(name, case)
        if reason:
            skipped[name] = reason
        else:
            engines.append(name)
    runs = {e: [] for e in engines}
    repeats = min(args.repeats, case.max_repeats or args.repeats)
    for r in range(repeats):
        order = engines[r % len(engines):] + engines[: r % len(engines)] if engines else []
        for name in order:
            if name in skipped:
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    run = train(name, case, data, case.epochs, threads)
            except Skip as exc:
                skipped[name] = str(exc)
                continue
            except Exception as exc:  # noqa: BLE001 - an engine failing is a result, not a crash of the suite
                skipped[name] = f"failed: {type(exc).__name__}: {exc}"[:500]
                log(f"  {name} FAILED: {skipped[name]}")
                continue
            runs[name].append(run)
            gc.collect()
        done = ", ".join(f"{e}={per_repeat(runs[e][-1].epoch_times) * 1e3:.2f}ms" for e in order
                         if e not in skipped and runs[e])
        log(f"  repeat {r + 1}/{repeats}: {done}")
    result = summarize_case(case, data, runs, skipped)
    if case.memory and not args.no_memory:
        wanted = set(args.memory_engines.split(",")) if args.memory_engines else None
        chosen = [e for e in engines if e not in skipped and (wanted is None or e in wanted)]
        result["memory"] = measure_memory(case, data, chosen, threads)
    result["wall_s"] = time.perf_counter() - t0
    return result


def summarize_case(case: Case, data, runs: dict, skipped: dict) -> dict:
    ref = case.reference if case.reference in runs and case.reference not in skipped else "ortflow-full"
    engines = {}  # the raw loop (the reference) needs the training build: full training stands in for it
    for name, rs in runs.items():
        if name in skipped or not rs:
            continue
        vals = [per_repeat(r.epoch_times) for r in rs]
        engines[name] = {
            "description": ENGINES[name],
            "ms_per_epoch": {k: v * 1e3 if k != "n" else v for k, v in extras.summarize(vals).items()},
            "setup_s": float(np.median([r.setup_s for r in rs])),
            "final_loss": rs[-1].losses[-1],
            "final_loss_repeats": [r.losses[-1] for r in rs],
            "loss_curve": rs[-1].losses,
            "epoch_s_all": [r.epoch_times for r in rs],
            "info": rs[-1].info,
        }
    if ref in engines:
        ref_vals = np.asarray([per_repeat(r.epoch_times) for r in runs[ref]])
        for name, e in engines.items():
            vals = np.asarray([per_repeat(r.epoch_times) for r in runs[name]])
            k = min(len(vals), len(ref_vals))
            paired = vals[:k] / ref_vals[:k]  # same repeat: neighbours in time
            e["ratio_to_ref"] = float(np.median(paired))
            e["ratio_min"], e["ratio_max"] = float(paired.min()), float(paired.max())
    return {
        "case": {**case.to_dict(), "reference": ref},
        "data_mb": data.nbytes / 2**20,
        "engines": engines,
        "skipped": skipped,
        "loss_check": loss_check(case, engines),
    }


def loss_check(case: Case, engines: dict, rtol: float = 0.05, atol_frac: float = 2e-3) -> dict:
    """All compared engines must end at about the same training loss: within ``rtol`` of their median, or within
    ``atol_frac`` of the first epoch's loss (for losses that go to ~0). Otherwise the timing comparison is void."""
    names = [n for n in case.checked_engines if n in engines]
    if len(names) < 2:
        return {"engines": names, "valid": None, "reason": "fewer than two engines to compare"}
    finals = {n: engines[n]["final_loss"] for n in names}
    first = float(np.median([engines[n]["loss_curve"][0] for n in names]))
    center = float(np.median(list(finals.values())))
    tol = max(rtol * abs(center), atol_frac * abs(first))
    bad = {n: v for n, v in finals.items() if not np.isfinite(v) or abs(v - center) > tol}
    return {
        "engines": names,
        "median_final_loss": center,
        "first_epoch_loss": first,
        "tolerance": tol,
        "valid": not bad,
        "outliers": bad,
    }


def measure_memory(case: Case, data, engines: list[str], threads: int) -> dict:
    """Peak RSS of each engine training one epoch, each in a fresh process."""
    log(f"  memory ({case.key}): {', '.join(engines)}")
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-mem-") as folder:
        np.save(os.path.join(folder, "X.npy"), data.X)
        np.save(os.path.join(folder, "y.npy"), data.y)
        with open(os.path.join(folder, "init.pkl"), "wb") as f:
            pickle.dump(data.init_model, f)
        with open(os.path.join(folder, "case.json"), "w") as f:
            json.dump(case.to_dict(), f)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        for name in engines:
            try:
                proc = subprocess.run([sys.executable, "-m", "bench.memory", folder, name, str(threads)],
                                      capture_output=True, text=True, timeout=900, env=env, cwd=str(ROOT))
            except subprocess.TimeoutExpired:
                out[name] = {"error": "timed out"}
                continue
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH-MEMORY ")]
            if proc.returncode or not lines:
                out[name] = {"error": (proc.stderr or proc.stdout)[-800:]}
            else:
                out[name] = json.loads(lines[-1][len("BENCH-MEMORY "):])
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if (args.quick or args.tiny) else 5
    threads = args.threads or os.cpu_count() or 1
    began = time.perf_counter()
    try:
        from ortflow._ort import ort

        ort.set_default_logger_severity(3)
    except ImportError as exc:
        print(f"bench: ortflow/onnxruntime not importable: {exc}", file=sys.stderr)
        return 2
    cases = default_cases(quick=args.quick, tiny=args.tiny)
    if args.cases:
        wanted = args.cases.split(",")
        cases = [c for c in cases if c.key in wanted or ("D" in wanted and c.key.startswith("D-"))]
    engines_filter = set(args.engines.split(",")) if args.engines else None
    mode = "tiny" if args.tiny else ("quick" if args.quick else "full")
    results = {
        "schema": 1,
        "mode": mode,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": "python -m bench.run " + " ".join(argv if argv is not None else sys.argv[1:]),
        "repeats": args.repeats,
        "machine": machine_info(threads),
        "cases": [],
    }
    log(f"mode={mode} repeats={args.repeats} threads={threads} cases={[c.key for c in cases]}")
    for case in cases:
        results["cases"].append(run_case(case, args, threads, engines_filter))

    by_key = {c.key: c for c in cases}
    first = by_key.get("A") or (cases[0] if cases else None)
    raw_loop = ortflow.backend() == "training"  # the sweep and the profile time onnxruntime-training's own loop
    if first is not None and not args.no_ort_settings and raw_loop:
        results["ort_settings"] = []
        targets = [first] + ([] if args.tiny else [c for c in cases if c.key in ("D-wide", "D-1e5")])
        for case in targets:
            log(f"SessionOptions sweep on {case.key}")
            epochs = (case.epochs // 2 or 1) if case.key == "A" else min(case.epochs, 2)
            repeats = 2 if args.tiny else 3
            results["ort_settings"].append(
                extras.measure_ort_settings(case, make_data(case), threads, repeats, epochs, log,
                                            with_torch=not engines_filter or "torch" in engines_filter))
    if first is not None and not args.no_mlflow:
        log(f"MLflow tracking cost on {first.key}")
        results["mlflow"] = extras.measure_mlflow(first, make_data(first), threads, args.repeats, log)
    if not args.no_pipeline and not args.tiny:
        log("python -m pipelines.main")
        results["pipeline"] = extras.measure_pipeline()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.profile and first is not None and raw_loop:
        log(f"cProfile on {first.key}")
        results["profile"] = extras.profile_loops(first, make_data(first), threads, first.epochs, out)

    results["machine"]["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    results["wall_s"] = time.perf_counter() - began
    results["targets"] = report.check_targets(results)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    plot_dir = out if args.no_docs else ROOT / "docs"
    results["plots"] = report.plots(results, plot_dir)
    markdown = report.markdown(results)
    for name in (f"bench-{mode}-{stamp}", f"latest-{mode}"):
        (out / f"{name}.json").write_text(json.dumps(results, indent=1, default=_json_default))
        (out / f"{name}.md").write_text(markdown)
    if not args.no_docs:
        report.update_docs(ROOT / "docs" / "PERFORMANCE.md", markdown)
    log(f"done in {results['wall_s']:.0f} s: {out / f'latest-{mode}.md'}")
    print(report.targets_table(results["targets"]))
    return 0


def _json_default(obj):
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


if __name__ == "__main__":
    sys.exit(main())
