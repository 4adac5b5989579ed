"""Many chains at once against one tracking store: ``python -m bench.concurrency [--chains 8]``.

Starts ``--chains`` ``python -m pipelines.main experiment=smoke`` processes together against (1) a PostgreSQL-backed
``mlflow server`` (pipelines.server) and (2) a fresh embedded sqlite store, then audits what the store holds: every
run FINISHED, every epoch's metric point present (counted), one registry version per chain and the alias on the
best version by the promotion metric. Prints the figures as a Markdown table (docs/SCALING.md quotes them).
The test suite runs the same :func:`run_chains` and :func:`audit` with fewer chains (tests/test_scale_*.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("convert", "add_loss", "train", "evaluate", "export")
EPOCH_METRICS = ("train_loss", "validation_loss", "epoch_time_seconds")
MAX_ITER = 3  # experiment=smoke


@dataclass
class Outcome:
    """What :func:`run_chains` saw: the chains' exit codes, their outputs and the wall time."""

    chains: int
    seconds: float
    returncodes: list[int]
    outputs: list[str]

    @property
    def chains_per_minute(self) -> float:
        return 60.0 * self.chains / self.seconds

    @property
    def failed(self) -> int:
        return sum(code != 0 for code in self.returncodes)


@dataclass
class Audit:
    runs: int = 0
    finished: int = 0
    metric_points: int = 0
    expected_points: int = 0
    versions: int = 0
    champion: str | None = None
    problems: list[str] = field(default_factory=list)


def chain_env(tracking_uri: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ORTFLOW_"))}
    env["MLFLOW_TRACKING_URI"] = tracking_uri
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_chains(n: int, tracking_uri: str, work_dir: Path, experiment: str, model: str,
               timeout: float = 900, connect_timeout: float = 30) -> Outcome:
    """Start ``n`` chains at once (learning rates 0.005, 0.01, ...), wait for all; returns their outcome."""
    work_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    begin = time.perf_counter()
    for i in range(n):
        cmd = [sys.executable, "-m", "pipelines.main", "experiment=smoke", f"mlflow.experiment_name={experiment}",
               f"mlflow.registered_model_name={model}", f"trainer.learning_rate={0.005 * (i + 1):g}",
               # every chain registers (the default registers only what takes the alias): the audit counts the
               # versions that racing registrations and promotions leave
               "promotion.register=always",
               f"mlflow.root={work_dir}", f"hydra.run.dir={work_dir / f'chain{i}'}",
               # the 5 s default preflight of /health gave up on a busy server (1 of 4 chains, 2 shared cores)
               f"mlflow.connect_timeout={connect_timeout:g}"]
        log = open(work_dir / f"chain{i}.log", "w")
        procs.append((subprocess.Popen(cmd, cwd=work_dir, env=chain_env(tracking_uri), stdout=log,
                                       stderr=subprocess.STDOUT), log))
    codes = []
    for proc, log in procs:
        codes.append(proc.wait(timeout=timeout))
        log.close()
    seconds = time.perf_counter() - begin
    outputs = [(work_dir / f"chain{i}.log").read_text() for i in range(n)]
    return Outcome(n, seconds, codes, outputs)


def audit(tracking_uri: str, experiment: str, model: str, chains: int) -> Audit:
    """Count what the store holds for ``chains`` chains of ``experiment``; ``problems`` lists every mismatch."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    found = Audit()
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        found.problems.append(f"experiment {experiment!r} missing")
        return found
    runs = client.search_runs([exp.experiment_id], max_results=10000)
    found.runs = len(runs)
    found.finished = sum(r.info.status == "FINISHED" for r in runs)
    if found.runs != chains * (1 + len(STAGES)):
        found.problems.append(f"{found.runs} runs, expected {chains * (1 + len(STAGES))}")
    found.problems += [f"run {r.info.run_id} ({r.info.run_name}) is {r.info.status}" for r in runs
                       if r.info.status != "FINISHED"]
    trains = [r for r in runs if r.data.tags.get("ortflow.stage") == "train"]
    found.expected_points = chains * len(EPOCH_METRICS) * MAX_ITER
    for run in trains:
        for key in EPOCH_METRICS:
            steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
            found.metric_points += len(steps)
            if steps != list(range(1, MAX_ITER + 1)):
                found.problems.append(f"run {run.info.run_id}: {key} steps {steps}")
    versions = client.search_model_versions(f"name='{model}'")
    found.versions = len(versions)
    if found.versions != chains:
        found.problems.append(f"{found.versions} versions of {model}, expected {chains}")
    undecided = [v.version for v in versions if "ortflow.promotion.decision" not in v.tags]
    if undecided:
        found.problems.append(f"versions without a promotion decision: {undecided}")
    try:
        champion = client.get_model_version_by_alias(model, "champion")
    except Exception as exc:  # noqa: BLE001 - reported as a problem
        found.problems.append(f"no @champion: {exc}")
        return found
    found.champion = str(champion.version)
    values = {str(v.version): float(v.tags["ortflow.promotion.candidate_value"]) for v in versions
              if "ortflow.promotion.candidate_value" in v.tags}
    if values and values.get(found.champion) != min(values.values()):
        found.problems.append(f"@champion is version {found.champion} ({values.get(found.champion)}), "
                              f"the best is {min(values, key=values.get)} ({min(values.values())})")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.concurrency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--chains", type=int, default=8)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from pipelines.server import TeamServer

    rows = []
    with tempfile.TemporaryDirectory(prefix="ortflow-scale-", dir="/tmp") as tmp:
        os.chmod(tmp, 0o755)  # the postgres user enters it
        stores = []
        server = TeamServer(Path(tmp) / "server", workers=2).start()
        try:
            stores.append(("PostgreSQL + mlflow server (2 workers)", server.url, Path(tmp) / "pg"))
            stores.append(("fresh sqlite file", f"sqlite:///{Path(tmp) / 'sqlite' / 'mlflow.db'}",
                           Path(tmp) / "sqlite"))
            for label, uri, work in stores:
                outcome = run_chains(args.chains, uri, work, "scale", "scale-smoke")
                found = audit(uri, "scale", "scale-smoke", args.chains)
                rows.append((label, outcome, found))
                print(f"{label}: {outcome.chains} chains in {outcome.seconds:.1f} s, failed {outcome.failed}, "
                      f"problems {found.problems}", flush=True)
        finally:
            server.stop()
    print("\n| store | chains at once | wall time (s) | chains per minute | failed chains | runs FINISHED | "
          "epoch metric points | versions | @champion on the best | problems |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, outcome, found in rows:
        best = "yes" if found.champion and not any("@champion" in p for p in found.problems) else "no"
        print(f"| {label} | {outcome.chains} | {outcome.seconds:.1f} | {outcome.chains_per_minute:.1f} | "
              f"{outcome.failed} | {found.finished}/{found.runs} | {found.metric_points}/{found.expected_points} | "
              f"{found.versions} | {best} | {len(found.problems)} |")
    print(f"\n{os.cpu_count()} CPU cores; python {sys.version.split()[0]}")
    return 0 if all(not o.failed and not f.problems for _, o, f in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
