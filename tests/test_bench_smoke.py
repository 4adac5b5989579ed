"""The benchmark suite runs end to end on tiny sizes and writes well-formed results (no timing assertions)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ortflow

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_quick_tiny_writes_results(tmp_path):
    out = tmp_path / "results"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [
        sys.executable, "-m", "bench.run", "--quick", "--tiny", "--no-docs", "--no-pipeline", "--no-mlflow",
        "--out", str(out), "--cases", "A,C,D-200,D-400,E",
        "--engines", "raw,ortflow-full,ortflow-fwbw,sklearn,ortflow-torch",
        "--memory-engines", "ortflow-full", "--threads", "1", "--repeats", "2",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    results = json.loads((out / "latest-tiny.json").read_text())
    assert (out / "latest-tiny.md").read_text().startswith("Run: `python -m bench.run")
    assert results["schema"] == 1 and results["mode"] == "tiny" and results["repeats"] == 2
    machine = results["machine"]
    assert machine["threads_used"] == 1 and machine["versions"]["onnxruntime"]
    assert {"cpu", "logical_cores", "thread_settings"} <= set(machine)

    cases = {c["case"]["key"]: c for c in results["cases"]}
    assert {"A", "C", "D-200", "D-400", "E"} == set(cases)
    a = cases["A"]
    assert {"ortflow-full", "sklearn", "ortflow-torch"} <= set(a["engines"])  # torch is in the test extras
    assert ("raw" in a["engines"]) == (ortflow.backend() == "training")  # the training API's loop
    for name, engine in a["engines"].items():
        ms = engine["ms_per_epoch"]
        assert ms["n"] == 2 and ms["min"] <= ms["median"] <= ms["max"]
        assert len(engine["loss_curve"]) == a["case"]["epochs"]
        assert len(engine["epoch_s_all"]) == 2
        assert "ratio_to_ref" in engine
    if "raw" in a["engines"]:
        assert a["engines"]["raw"]["ratio_to_ref"] == pytest.approx(1.0)
    assert a["loss_check"]["valid"] is True  # same start, same data order: the same losses
    # C compares momentum engines only: the raw loop and full training are skipped with a reason.
    assert "raw" not in cases["C"]["engines"] and "momentum" in cases["C"]["skipped"].get("raw", "momentum")

    # E: ten classes; the raw loop (one-hot rows), both trainers and scikit-learn end at the same loss
    assert set(cases["E"]["engines"]) == {"raw", "ortflow-full", "ortflow-fwbw", "sklearn"}
    assert cases["E"]["loss_check"]["valid"] is True and cases["E"]["case"]["n_features"] == 64

    mem = cases["D-400"]["memory"]["ortflow-full"]
    assert mem["peak_rss_mb"] >= mem["base_rss_mb"] > 0 and mem["data_mb"] > 0

    statuses = {t["status"] for t in results["targets"]}
    assert statuses <= {"pass", "FAIL", "void", "n/a"}
    assert any(t["target"].startswith("ortflow full / raw loop") for t in results["targets"])
    if ortflow.backend() == "training":  # the SessionOptions sweep times onnxruntime-training's raw loop
        sweep = results["ort_settings"][0]
        assert sweep["case"] == "A" and "default (threads=T)" in sweep["variants"]
    else:
        assert "ort_settings" not in results
    assert all(Path(p).is_file() for p in results["plots"])


def test_the_generated_block_of_performance_md_is_replaced_in_place(tmp_path):
    """``python -m bench.run`` rewrites only the block between its markers in docs/PERFORMANCE.md."""
    from bench import report

    text = (ROOT / "docs" / "PERFORMANCE.md").read_text()
    assert text.count(report.BEGIN) == 1 and text.count(report.END) == 1
    assert text.index(report.BEGIN) < text.index(report.END)
    copy = tmp_path / "PERFORMANCE.md"
    copy.write_text(text)
    report.update_docs(copy, "Run: new figures")
    new = copy.read_text()
    before, after = text.split(report.BEGIN)[0], text.split(report.END)[1]
    assert new == f"{before}{report.BEGIN}\n\nRun: new figures\n\n{report.END}{after}"


def test_reference_models_bench_writes_results(tmp_path):
    """``python -m bench.reference_models`` (issue 26, item 5) times every engine it can run here (torch's only
    where torch is installed) and profiles the step graph; the engines end at the same loss (same start, same
    batches)."""
    out = tmp_path / "reference.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "bench.reference_models", "--models", "lenet", "--threads", "1", "--repeats", "2",
           "--epochs", "1", "--profile-steps", "2", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| ortflow-full |" in proc.stdout and "Step graph of lenet" in proc.stdout
    results = json.loads(out.read_text())
    (run,) = results["results"]
    try:
        import torch  # noqa: F401
        expected = {"torch", "ortflow-full", "ortflow-fwbw", "torch-head", "ortflow-full-head"}
    except ImportError:
        expected = {"ortflow-full", "ortflow-fwbw", "ortflow-full-head"}
    assert set(run["ms_per_epoch"]) == expected and len(run["ms_per_epoch"]["ortflow-full"]["all"]) == 2
    finals = {e: curve[-1] for e, curve in run["losses"].items() if not e.endswith("-head")}
    from reference_data import LOSS_RTOL

    assert max(finals.values()) - min(finals.values()) <= LOSS_RTOL * min(finals.values())
    (profile,) = results["profiles"]
    assert {p["part"] for p in profile["parts"]} == {"forward", "backward", "loss and update"}
    assert "Conv" in {o["op"] for o in profile["op_types"]}
    # each part's share is a float64 sum of node times over their total: 1 up to a rounding per node
    assert sum(p["share"] for p in profile["parts"]) == pytest.approx(1.0, abs=profile["nodes"] * 2.0**-52)


@pytest.mark.slow
def test_bench_streaming_tiny_reports_every_engine(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "bench.streaming", "--rows", "20000", "--sample", "5000", "--repeats", "1",
           "--models", "mlp", "--compression", "none", "--folder", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])["summary"]
    assert set(summary) == {"mlp/stream", "mlp/memory", "mlp/memory-sleeping", "mlp/sklearn"}
    assert summary["mlp/stream"]["rows"] == 20000
    assert summary["mlp/memory"]["rows"] == summary["mlp/memory-sleeping"]["rows"] == 5000
    assert all(s["rows_per_second"] > 0 and s["peak_rss_mb"] > 0 for s in summary.values())
    assert (tmp_path / "table-none.parquet").exists()


def test_bench_gpu_runs_its_code_on_cpu_and_refuses_without_a_gpu(tmp_path):
    """``python -m bench.gpu --cpu-smoke``: both engines from the same start reach the same loss (the same problem
    and batches), and the GPU block of a PERFORMANCE.md is written between its markers; without ``--cpu-smoke`` on
    a machine without CUDA it exits with status 2, saying why."""
    pytest.importorskip("torch")
    from bench import gpu

    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text(f"# Performance\n\nbefore\n\n{gpu.BEGIN}\nold\n{gpu.END}\n\nafter\n")
    out = tmp_path / "gpu.json"
    assert gpu.main(["--cpu-smoke", "--cases", "A", "--precisions", "fp32", "--doc", str(doc),
                     "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["machine"]["device"] == "cpu"
    (a,) = results["results"]
    assert a["case"] == "A" and len(a["ms_per_epoch"]["ortflow"]["all"]) == a["repeats"] == 2
    assert a["last_loss"]["ortflow"] == pytest.approx(a["last_loss"]["torch"], rel=1e-4)
    text = doc.read_text()
    assert "old" not in text and "before" in text and "after" in text and "| seed case A" in text
    if gpu.gpu_missing():
        assert gpu.main(["--no-docs"]) == 2
