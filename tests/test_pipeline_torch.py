"""``trainer=torch``: the pipelines train the converted graph through ortflow.torch.OnnxModule."""

import json
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

pytest.importorskip("torch")

from test_pipeline_chain import _chain, _check_chain  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw"])
def test_chain_with_torch_trainer(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri, optimizer):
    result = _chain(compose_pipeline, tmp_path, sqlite_uri, "trainer=torch", f"trainer.optimizer={optimizer}",
                    "trainer.lr_schedule=invscaling")
    client = MlflowClient(sqlite_uri)
    _, children = _check_chain(client, result, "torch")
    train = children["train"]
    assert train.data.params["trainer.optimizer"] == optimizer
    rates = sorted(client.get_metric_history(train.info.run_id, "learning_rate"), key=lambda m: m.step)
    assert [m.value for m in rates] == pytest.approx([0.01 / epoch ** 0.25 for epoch in (1, 2, 3)])
    summary = json.loads(Path(mlflow.artifacts.download_artifacts(
        run_id=train.info.run_id, artifact_path="train_summary.json")).read_text())
    assert summary["trainer"] == "TorchTrainer"
    losses = sorted(client.get_metric_history(train.info.run_id, "train_loss"), key=lambda m: m.step)
    assert losses[-1].value < losses[0].value


@pytest.mark.slow
def test_torch_trainer_on_a_classifier(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri):
    result = _chain(compose_pipeline, tmp_path, sqlite_uri, "trainer=torch", "data=classification",
                    "model=mlp_classifier", "loss=log", "trainer.max_iter=5", "stages=[convert,train,evaluate]")
    client = MlflowClient(sqlite_uri)
    runs = client.search_runs([client.get_run(result.run_id).info.experiment_id],
                              f"tags.mlflow.parentRunId = '{result.run_id}'")
    evaluate = next(r for r in runs if r.data.tags["ortflow.stage"] == "evaluate")
    assert evaluate.info.status == "FINISHED"
    assert any(k.startswith("test_") for k in evaluate.data.metrics)


def test_torch_trainer_refuses_checkpoints(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri):
    from pipelines.base.config import ConfigError

    with pytest.raises(ConfigError, match="trainer=torch does not write or read checkpoints"):
        _chain(compose_pipeline, tmp_path, sqlite_uri, "trainer=torch", "trainer.checkpoint_every=1")
