"""One intra-op thread against all cores, per case and trainer, and the default the trainers pick.

    python -m bench.threads                  # the grid below, 5 interleaved repeats
    python -m bench.threads --repeats 3 --cases A,D-wide

For every case and trainer (full, fwbw) the three settings ``n_threads=1``, ``n_threads=<all cores>`` and the
default (``n_threads=None``: :func:`ortflow.runtime.sessions.threads_for_work`) train in turn, the order rotating from one
repeat to the next; a run's number is its median epoch (the first left out), a setting's number the median over
repeats. The work of a batch is ``batch_size x float weights`` (multiply-adds of the forward pass). The cases
where one thread wins and those where all cores win give the threshold the rule uses: the geometric mean of the
largest work one thread wins and the smallest work all cores win (printed as ``calibrated threshold``; not
separable when one setting wins everywhere, as on an oversubscribed machine). Above the threshold the default
takes the cores no other task wants at fit time, so the thread count it picked is recorded per run.
Results go to ``bench/results/threads.json``.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from ortflow.runtime.sessions import STEP_GRAPH_THREADS_THRESHOLD, THREADS_WORK_THRESHOLD, all_cores

from .cases import Case, default_cases, make_data
from .engines import train
from .run import machine_info, per_repeat

RESULTS = Path(__file__).resolve().parent / "results"
TRAINERS = ("ortflow-full", "ortflow-fwbw")


def cases() -> list[Case]:
    """The suite's A, B, D-1e4 and D-wide (fewer rows), and a grid between them (width x batch)."""
    suite = {c.key: c for c in default_cases()}
    picked = [
        replace(suite["A"], epochs=8),
        replace(suite["B"], epochs=8, engines=TRAINERS),
        replace(suite["D-1e4"], epochs=3, memory=False),
        replace(suite["D-wide"], n_rows=8_000, epochs=3, memory=False),
    ]
    for hidden, batch, rows in [((50, 10), 64, 4_000), ((50, 10), 256, 8_000), ((128, 128), 15, 1_500),
                                ((128, 128), 64, 4_000), ((256, 256), 15, 1_500), ((256, 256), 64, 4_000)]:
        picked.append(Case(f"G-{'x'.join(map(str, hidden))}-b{batch}", f"MLP {hidden} regression, batch {batch}",
                           n_rows=rows, split=False, hidden=hidden, batch_size=batch, epochs=3,
                           engines=TRAINERS))
    return picked


def weights_of(case: Case) -> int:
    """Float weights of the case's MLP: what one row multiplies through."""
    sizes = [case.n_features, *case.hidden, 1]
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


def measure(case: Case, repeats: int) -> dict:
    data = make_data(case)
    cores = all_cores()
    settings = {"1": 1, "all": cores, "default": None}
    out = {"case": case.key, "title": case.title, "batch_size": case.batch_size, "weights": weights_of(case),
           "work": case.batch_size * weights_of(case), "rows": len(data.X), "trainers": {}}
    for trainer in TRAINERS:
        times = {k: [] for k in settings}
        picks = []
        for r in range(repeats):
            keys = list(settings)
            keys = keys[r % len(keys):] + keys[: r % len(keys)]
            for key in keys:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    run = train(trainer, case, data, case.epochs, settings[key])
                times[key].append(per_repeat(run.epoch_times))
                if key == "default":
                    picks.append(run.info["n_threads"])
        med = {k: float(np.median(v)) for k, v in times.items()}
        best = min(med["1"], med["all"])
        # the setting the default picked in most runs (the pick follows the machine's load above the threshold)
        chosen = max(set(picks), key=picks.count)
        picked = med["1"] if chosen == 1 else med["all"]
        out["trainers"][trainer] = {"ms": {k: v * 1e3 for k, v in med.items()},
                                    "runs_ms": {k: [t * 1e3 for t in v] for k, v in times.items()},
                                    "winner": "1" if med["1"] <= med["all"] else "all",
                                    # the default runs the setting it picks: its own runs, and that setting's
                                    "default_vs_best": med["default"] / best,
                                    "picked_vs_best": picked / best,
                                    "all_vs_1": med["all"] / med["1"], "default_threads": picks}
    return out


#: the threshold each trainer's default uses (full training runs ortflow's step graphs by default)
IN_CODE = {"ortflow-full": STEP_GRAPH_THREADS_THRESHOLD, "ortflow-fwbw": THREADS_WORK_THRESHOLD}


def calibrate(results: list[dict]) -> dict:
    """Per trainer, the threshold separating the cases one thread wins from those all cores win."""
    out = {}
    for trainer in TRAINERS:
        runs = [(r["work"], r["trainers"][trainer]["winner"]) for r in results if trainer in r["trainers"]]
        low = max((w for w, winner in runs if winner == "1"), default=None)
        high = min((w for w, winner in runs if winner == "all"), default=None)
        threshold = float(np.sqrt(low * high)) if low is not None and high is not None and low < high else None
        out[trainer] = {"largest_work_1_wins": low, "smallest_work_all_wins": high,
                        "separable": threshold is not None, "calibrated_threshold": threshold,
                        "threshold_in_code": IN_CODE[trainer]}
    return out


def table(results: list[dict], cores: int) -> str:
    lines = [f"| case | batch x weights | trainer | 1 thread ms | {cores} threads ms | default ms (threads) | "
             "default / best | picked setting / best |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for trainer, t in r["trainers"].items():
            ms = t["ms"]
            lines.append(f"| {r['case']} | {r['work']:,} | {trainer.replace('ortflow-', '')} | {ms['1']:.3g} | "
                         f"{ms['all']:.3g} | {ms['default']:.3g} ({_picks(t['default_threads'])}) | "
                         f"{t['default_vs_best']:.3f} | {t['picked_vs_best']:.3f} |")
    return "\n".join(lines)


def _picks(picks: list[int]) -> str:
    return ",".join(f"{n}x{picks.count(n)}" if picks.count(n) > 1 else str(n) for n in sorted(set(picks)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cases", default="", help="comma-separated case keys (default: all)")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    wanted = set(filter(None, args.cases.split(",")))
    begin = time.time()
    results = []
    for case in cases():
        if wanted and case.key not in wanted:
            continue
        results.append(measure(case, args.repeats))
        r = results[-1]
        print(f"{case.key}: work {r['work']:,} " + ", ".join(
            f"{t.replace('ortflow-', '')} 1={v['ms']['1']:.3g} all={v['ms']['all']:.3g} "
            f"default={v['ms']['default']:.3g} ms" for t, v in r["trainers"].items()), flush=True)
    cores = all_cores()
    report = {"machine": machine_info(cores), "repeats": args.repeats, "wall_s": time.time() - begin,
              "cases": results, "calibration": calibrate(results)}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "threads.json").write_text(json.dumps(report, indent=1))
    print(table(results, cores))
    print("calibration:", report["calibration"])
    for key in ("default_vs_best", "picked_vs_best"):
        worst = max(t[key] for r in results for t in r["trainers"].values())
        print(f"worst {key.replace('_', ' ')}: {worst:.3f} (target <= 1.05)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
