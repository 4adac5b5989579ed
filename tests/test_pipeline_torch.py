"""``trainer=torch``: the pipelines train the converted graph through ortflow.torch.OnnxModule."""

import json
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

pytest.importorskip("torch")

from test_pipeline_chain import _chain, _check_chain  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd"])
def test_chain_with_torch_trainer(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri, optimizer):
    """The rate follows the schedule of the other trainers (ortflow.optimizers.schedules, per samples seen); a schedule
    applies to the optimizers that take one (sgd, nesterov): with adam(w) trainer.lr_schedule is refused."""
    from ortflow.optimizers.schedules import learning_rate_at

    result = _chain(compose_pipeline, tmp_path, sqlite_uri, "trainer=torch", f"trainer.optimizer={optimizer}",
                    "trainer.lr_schedule=invscaling")
    client = MlflowClient(sqlite_uri)
    _, children = _check_chain(client, result, "torch")
    train = children["train"]
    assert train.data.params["trainer.optimizer"] == optimizer
    n_train = int(children["convert"].data.metrics["n_train"])
    rates = sorted(client.get_metric_history(train.info.run_id, "learning_rate"), key=lambda m: m.step)
    assert [m.value for m in rates] == pytest.approx(
        [learning_rate_at("invscaling", 0.01, epoch * n_train, 0.25) for epoch in (0, 1, 2)])
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


@pytest.mark.slow
def test_torch_trainer_writes_checkpoints_as_the_others(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri):
    """trainer=torch runs on BaseTrainer's loop: trainer.checkpoint_every logs checkpoints like full and fwbw."""
    result = _chain(compose_pipeline, tmp_path, sqlite_uri, "trainer=torch", "trainer.checkpoint_every=1",
                    "stages=[convert,train]")
    client = MlflowClient(sqlite_uri)
    train = client.get_run(result.stage_run_ids["train"])
    assert train.info.status == "FINISHED"
    assert "trainer.json" in [f.path.split("/")[-1] for f in client.list_artifacts(train.info.run_id, "checkpoint")]
