"""Lineage: dataset inputs of the stage runs, the source tags of ``python -m pipelines...`` runs, system metrics."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_chain_logs_its_data_inputs_source_tags_and_system_metrics(tmp_path, pipeline_subprocess_env):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(120, 3)), columns=["area", "rooms", "age"])
    frame["price"] = frame @ np.array([3.0, -2.0, 0.5]) + rng.normal(scale=0.1, size=120)
    frame.to_csv(tmp_path / "houses.csv", index=False)
    env = dict(pipeline_subprocess_env, MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL="0.2",
               MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING="1")
    cmd = [sys.executable, "-m", "pipelines.main", "data=file", "data.path=houses.csv", "data.target=price",
           "model=linear", "trainer.max_iter=2", "stages=[convert,add_loss,train,evaluate]",
           "mlflow.system_metrics=true", "hydra.run.dir=out"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("ortflow").experiment_id])
    by_stage = {r.data.tags.get("ortflow.stage", "parent"): r for r in runs}
    assert set(by_stage) == {"parent", "convert", "add_loss", "train", "evaluate"}

    def inputs(stage):
        found = {}
        for item in client.get_run(by_stage[stage].info.run_id).inputs.dataset_inputs:
            context = {t.key: t.value for t in item.tags}["mlflow.data.context"]
            found[context] = item.dataset
        return found

    convert = inputs("convert")
    assert set(convert) == {"training", "validation", "testing"}
    assert set(inputs("train")) == {"training", "validation"} and set(inputs("evaluate")) == {"testing"}
    assert inputs("add_loss") == {}
    for context, dataset in convert.items():
        assert json.loads(dataset.source) == {"uri": (tmp_path / "houses.csv").as_uri()}
        columns = [c["name"] for c in json.loads(dataset.schema)["mlflow_colspec"]]
        assert columns == ["area", "rooms", "age", "price"]
        assert dataset.name.startswith("houses-")  # data.name: the file's name by default
    assert inputs("train")["training"].digest == convert["training"].digest  # the same rows, the same digest
    assert convert["training"].digest != convert["testing"].digest
    rows = {c: json.loads(d.profile)["num_rows"] for c, d in convert.items()}
    assert sum(rows.values()) == 120 and rows["testing"] == 24

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    for stage, run in by_stage.items():
        tags = run.data.tags
        assert tags["mlflow.source.type"] == "LOCAL" and tags["mlflow.user"], stage
        assert tags["mlflow.source.name"].endswith("pipelines/main.py"), stage
        assert tags["mlflow.source.git.commit"] == commit, stage
    train = client.get_run(by_stage["train"].info.run_id)
    assert any(k.startswith("system/cpu_utilization") for k in train.data.metrics), sorted(train.data.metrics)
    features = json.loads(Path(client.download_artifacts(by_stage["convert"].info.run_id, "data/features.json",
                                                         str(tmp_path))).read_text())
    assert features["features"] == ["area", "rooms", "age"] and features["n_rows_dropped"] == 0
    assert by_stage["convert"].data.tags["ortflow.features"] == "area,rooms,age"


def test_split_datasets_hold_raw_features_and_original_labels(compose_pipeline, tmp_path):
    from pipelines.data import make_split
    from pipelines.lineage import split_datasets

    rng = np.random.default_rng(1)
    frame = pd.DataFrame(rng.normal(5.0, 2.0, size=(60, 2)), columns=["x1", "x2"])
    frame["label"] = np.where(frame.x1 > 5.0, 4, 2)  # labels that are not class indices
    frame.to_csv(tmp_path / "table.csv", index=False)
    cfg = compose_pipeline("data=file", f"data.path={tmp_path / 'table.csv'}", "data.target=label",
                           "data.task=classification", "model=logistic", "loss=log", "data.name=signups")
    split = make_split(cfg.data)
    datasets = split_datasets(split, cfg.data)
    assert set(datasets) == {"train", "validation", "test"}
    test = datasets["test"].df
    assert list(test.columns) == ["x1", "x2", "label"] and len(test) == 12
    # raw feature values (through float32), found again in the table, with the table's labels
    nearest = [int(np.argmin(np.abs(frame[["x1", "x2"]].to_numpy() - row).sum(axis=1)))
               for row in test[["x1", "x2"]].to_numpy()]
    np.testing.assert_allclose(test[["x1", "x2"]].to_numpy(), frame.loc[nearest, ["x1", "x2"]].to_numpy(), rtol=1e-6)
    np.testing.assert_array_equal(test["label"].to_numpy(), frame.loc[nearest, "label"].to_numpy())
    assert datasets["test"].name == "signups-test" and datasets["test"].targets == "label"
    assert split_datasets(make_split(cfg.data), cfg.data)["train"].digest == datasets["train"].digest
