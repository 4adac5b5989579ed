"""The console transcripts of docs/PIPELINES.md marked ``<!-- run by tests/test_pipeline_docs.py -->``, run as
written: each ``$ command`` in one folder holding the ``houses.csv`` the page describes; every line shown must be
printed (``…`` stands for text left out), and a transcript showing ``ortflow: error:`` exits with status 2.
The documented chain's store is then read for the lineage the page describes (data inputs, source tags,
system metrics, the feature list and what was dropped)."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "PIPELINES.md"
MARK = "<!-- run by tests/test_pipeline_docs.py -->"


def transcripts() -> list[tuple[str, list[str]]]:
    """(command, lines shown) of every marked console block, in page order."""
    found = []
    for block in re.findall(re.escape(MARK) + r"\n```console\n(.*?)```", DOC.read_text(), re.S):
        for chunk in block.split("$ ")[1:]:
            command, *shown = chunk.rstrip("\n").split("\n")
            found.append((command, shown))
    return found


def write_houses(folder: Path) -> None:
    """The table of 'Your own data': area, rooms, city (text), price; rows 6 and 18 miss their area."""
    rng = np.random.default_rng(0)
    n = 200
    frame = pd.DataFrame({"area": rng.normal(100, 25, n).round(1), "rooms": rng.integers(1, 7, n),
                          "city": rng.choice(["Lyon", "Paris", "Nantes"], n)})
    frame["price"] = (2.5 * frame.area + 12 * frame.rooms + rng.normal(0, 10, n)).round(1)
    frame.loc[[5, 17], "area"] = np.nan
    frame.to_csv(folder / "houses.csv", index=False)


def _printed(line: str, output: list[str]) -> bool:
    pieces = [p for p in line.split("…") if p]
    for out in output:
        at = 0
        for piece in pieces:
            at = out.find(piece, at)
            if at < 0:
                break
            at += len(piece)
        else:
            return True
    return False


def test_transcripts_are_marked():
    commands = [c for c, _ in transcripts()]
    assert len(commands) >= 6 and all(c.startswith("python -m pipelines.") for c in commands)


@pytest.mark.slow
def test_documented_commands_print_what_the_page_shows_and_log_their_lineage(tmp_path, pipeline_subprocess_env):
    write_houses(tmp_path)
    # system metrics sampled often enough for a chain of a few seconds
    env = dict(pipeline_subprocess_env, MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL="0.2",
               MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING="1")
    for command, shown in transcripts():
        words = shlex.split(command)
        proc = subprocess.run([sys.executable, *words[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        output = (proc.stdout + proc.stderr).splitlines()
        expected = 2 if any(line.startswith("ortflow: error:") for line in shown) else 0
        assert proc.returncode == expected, (command, output[-30:])
        for line in shown:
            assert _printed(line, output), (command, line, output[-30:])
    check_lineage(tmp_path)


def check_lineage(folder: Path) -> None:
    """The store of the documented chain: data inputs, source tags, system metrics, the features and the drops."""
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("ortflow").experiment_id])
    by_stage = {r.data.tags.get("ortflow.stage", "parent"): r for r in runs}
    assert set(by_stage) == {"parent", "convert", "add_loss", "train", "evaluate"}

    def inputs(stage):
        found = {}
        for item in client.get_run(by_stage[stage].info.run_id).inputs.dataset_inputs:
            found[{t.key: t.value for t in item.tags}["mlflow.data.context"]] = item.dataset
        return found

    convert = inputs("convert")
    assert set(convert) == {"training", "validation", "testing"}
    assert set(inputs("train")) == {"training", "validation"} and set(inputs("evaluate")) == {"testing"}
    assert inputs("add_loss") == {}
    for dataset in convert.values():
        assert json.loads(dataset.source) == {"uri": (folder / "houses.csv").as_uri()}
        assert [c["name"] for c in json.loads(dataset.schema)["mlflow_colspec"]] == ["area", "rooms", "price"]
        assert dataset.name.startswith("houses-")  # data.name: the file's name by default
    assert inputs("train")["training"].digest == convert["training"].digest  # the same rows, the same digest
    assert convert["training"].digest != convert["testing"].digest
    rows = {c: json.loads(d.profile)["num_rows"] for c, d in convert.items()}
    assert sum(rows.values()) == 198  # 200 read, 2 dropped

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    for stage, run in by_stage.items():
        tags = run.data.tags
        assert tags["mlflow.source.type"] == "LOCAL" and tags["mlflow.user"], stage
        assert tags["mlflow.source.name"].endswith("pipelines/main.py"), stage
        assert tags["mlflow.source.git.commit"] == commit, stage
    train = client.get_run(by_stage["train"].info.run_id)
    assert any(k.startswith("system/cpu_utilization") for k in train.data.metrics), sorted(train.data.metrics)

    run = by_stage["convert"]
    assert run.data.metrics["n_rows_read"] == 200 and run.data.metrics["n_rows_dropped"] == 2
    assert run.data.metrics["n_columns_dropped"] == 1 and run.data.tags["ortflow.dropped_columns"] == "city"
    assert run.data.tags["ortflow.features"] == "area,rooms"
    features = json.loads(Path(client.download_artifacts(run.info.run_id, "data/features.json",
                                                         str(folder))).read_text())
    assert features["features"] == ["area", "rooms"] and features["dropped_columns"] == "city"
