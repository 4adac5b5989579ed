"""Peak resident memory of one engine, measured in a fresh process.

``tracemalloc`` does not see what onnxruntime or PyTorch allocate in C++, so the bench reads the operating system's
high-water mark of the resident set (``VmHWM`` of /proc/self/status on Linux; ``ru_maxrss`` elsewhere, which can
include the parent's peak after fork/exec on Linux, hence /proc first). The parent writes the training rows once
(``X.npy``, ``y.npy``) and the initial model (``init.pkl``); the child imports its engine's libraries, notes its
resident set (``base``), loads the rows, trains one epoch and reports the peak.

    python -m bench.memory FOLDER ENGINE THREADS
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import sys


def rss_bytes() -> int:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:  # pragma: no cover - psutil is in the bench extra
        return _status_kb("VmRSS") * 1024


def peak_rss_bytes() -> int:
    try:
        return _status_kb("VmHWM") * 1024
    except (OSError, KeyError):  # pragma: no cover - not Linux
        scale = 1 if sys.platform == "darwin" else 1024
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _preload(engine: str) -> None:
    """Import what the engine needs, so that imports count in ``base``, not in the training peak."""
    import sklearn.neural_network  # noqa: F401  (all engines unpickle the initial model)

    if engine in ("raw", "ortflow-full", "ortflow-fwbw"):
        import ortflow  # noqa: F401
        from ortflow._ort import api  # noqa: F401
    if engine in ("torch", "ortflow-torch"):
        import torch  # noqa: F401
    if engine.startswith("sklearn"):
        import threadpoolctl  # noqa: F401


def measure(folder: str, engine: str, threads: int) -> dict:
    import numpy as np

    from .cases import Case, CaseData
    from .engines import train

    _preload(engine)
    with open(os.path.join(folder, "case.json")) as f:
        spec = json.load(f)
    spec.pop("n_train", None)
    spec["hidden"] = tuple(spec["hidden"])
    spec["engines"] = tuple(spec["engines"])
    if spec.get("loss_engines") is not None:
        spec["loss_engines"] = tuple(spec["loss_engines"])
    case = Case(**spec)
    with open(os.path.join(folder, "init.pkl"), "rb") as f:
        init = pickle.load(f)
    base = rss_bytes()
    X = np.load(os.path.join(folder, "X.npy"))
    y = np.load(os.path.join(folder, "y.npy"))
    data = CaseData(X, y, init)
    run = train(engine, case, data, 1, threads)
    peak = peak_rss_bytes()
    return {
        "engine": engine,
        "base_rss_mb": base / 2**20,
        "peak_rss_mb": peak / 2**20,
        "data_mb": data.nbytes / 2**20,
        "training_mb": (peak - base) / 2**20,
        "epoch_s": run.epoch_times[0],
        "loss": run.losses[0],
    }


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    folder, engine, threads = argv[0], argv[1], int(argv[2])
    print("BENCH-MEMORY " + json.dumps(measure(folder, engine, threads)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
