"""The pipeline chain and its stages, in process, against real tracking stores (sqlite file, mlflow server)."""

import json
import math
import os
from pathlib import Path

import mlflow
import numpy as np
import onnx
import onnxruntime
import pandas as pd
import pytest
from mlflow import MlflowClient

import ortflow
from pipelines.orchestration.chain import report, run_chain
from pipelines.execution.runner import run_standalone
from pipelines.stages.add_loss import add_loss
from pipelines.stages.convert import convert
from pipelines.stages.evaluate import evaluate
from pipelines.stages.export import export
from pipelines.stages.train import train

STAGES = ["convert", "add_loss", "train", "evaluate", "export"]
MODEL = "ortflow-smoke-regression-mlp_regressor"


def _chain(compose_pipeline, tmp_path, uri, *overrides, name="chain"):
    cfg = compose_pipeline("experiment=smoke", f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path}", *overrides)
    return run_chain(cfg, work_dir=tmp_path / name)


def test_two_chains_in_one_process_each_go_to_their_own_experiment(compose_pipeline, clean_mlflow_env, tmp_path):
    """Seen (under pytest-xdist, a chain test then another in one worker): ``mlflow.set_experiment`` in the first
    chain's setup left ``MLFLOW_EXPERIMENT_ID`` in the environment, which wins over the config, so a notebook's
    second chain went to the first one's experiment (or, on another store, failed: 'Run ... not found')."""
    first, second = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    results = [_chain(compose_pipeline, tmp_path, uri, f"mlflow.experiment_name={name}", "stages=[convert]",
                      name=name)
               for uri, name in ((first, "first"), (first, "second"), (second, "third"))]
    for (uri, name), result in zip(((first, "first"), (first, "second"), (second, "third")), results):
        run = MlflowClient(uri).get_run(result.run_id)
        assert MlflowClient(uri).get_experiment(run.info.experiment_id).name == name
    assert "MLFLOW_EXPERIMENT_ID" not in os.environ


def _children(client, parent):
    runs = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    return {r.data.tags["ortflow.stage"]: r for r in runs}


def _check_chain(client, result, trainer):
    parent = client.get_run(result.run_id)
    assert parent.info.status == "FINISHED"
    children = _children(client, parent)
    assert sorted(children) == sorted(STAGES)
    assert all(r.info.status == "FINISHED" for r in children.values())
    assert {k: r.info.run_id for k, r in children.items()} == result.stage_run_ids

    # the resolved config: flattened params and the YAML artifact
    tr = children["train"]
    assert tr.data.params["trainer.name"] == trainer
    assert tr.data.params["trainer.max_iter"] == "3"
    assert tr.data.params["model.hidden_layer_sizes"] == "[8]"
    assert tr.data.params["data.n_samples"] == "200"
    if trainer != "torch":  # ortflow's trainers choose their threads by the work: a batch of 8-unit MLP rows
        assert tr.data.params["trainer.n_threads_"] == "1"
    assert parent.data.params["trainer.name"] == trainer
    # where it ran: the device, no GPU, the default precision, the onnxruntime build (issue 39)
    assert tr.data.tags["ortflow.device"] == "cpu" and tr.data.tags["ortflow.gpu"] == "none"
    assert tr.data.tags["ortflow.precision"] == "fp32"
    assert f" {onnxruntime.__version__}" in tr.data.tags["ortflow.onnxruntime"]
    config = Path(mlflow.artifacts.download_artifacts(run_id=tr.info.run_id, artifact_path="config/config.yaml"))
    assert "max_iter: 3" in config.read_text()

    # per-epoch metric histories with steps
    for key in ("train_loss", "validation_loss", "epoch_time_seconds"):
        history = client.get_metric_history(tr.info.run_id, key)
        assert [m.step for m in sorted(history, key=lambda m: m.step)] == [1, 2, 3], key
    assert tr.data.metrics["n_epochs"] == 3
    assert tr.data.metrics["time_fit_seconds"] > 0 and "time_train_seconds" in tr.data.metrics
    assert all(math.isfinite(v) for v in tr.data.metrics.values())

    # every graph the trainer used, logged and loadable by onnxruntime
    graphs = {Path(f.path).name for f in client.list_artifacts(tr.info.run_id, "graphs")}
    assert "trained_model.onnx" in graphs and len(graphs) >= 3
    folder = Path(mlflow.artifacts.download_artifacts(run_id=tr.info.run_id, artifact_path="graphs"))
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    for path in sorted(folder.glob("*.onnx")):
        proto = onnx.load(str(path))
        assert len(proto.graph.node) > 0, path.name
        if path.name == "backward.onnx":
            # fwbw's backward graph is onnxruntime's partial graph (YieldOp boundary): logged to inspect it,
            # it only runs inside the TrainingAgent
            assert trainer == "fwbw"
            continue
        onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for stage, graph in (("convert", "model.onnx"), ("add_loss", "model_with_loss.onnx"),
                         ("evaluate", "deploy_model.onnx")):
        names = [Path(f.path).name for f in client.list_artifacts(children[stage].info.run_id, "graphs")]
        assert graph in names

    # plots
    assert [f.path for f in client.list_artifacts(tr.info.run_id, "plots")] == ["plots/loss_curves.png"]
    assert [f.path for f in client.list_artifacts(children["evaluate"].info.run_id, "plots")] == [
        "plots/predicted_vs_actual.png"]

    # test metrics of the ONNX model next to scikit-learn's
    ev = children["evaluate"].data.metrics
    for key in ("test_mse", "test_mae", "test_r2", "sklearn_test_mse", "sklearn_test_mae", "sklearn_test_r2"):
        assert math.isfinite(ev[key]), key
    assert result.metrics["test_mse"] == ev["test_mse"]
    assert parent.data.metrics["objective"] == pytest.approx(result.value)
    assert result.value == pytest.approx(tr.data.metrics["best_validation_loss"], rel=1) and result.value > 0

    # the registered version and the alias
    export_run = children["export"]
    version = export_run.data.tags["ortflow.registered_version"]
    mv = client.get_model_version(MODEL, version)
    assert mv.run_id == export_run.info.run_id
    assert mv.tags["ortflow.promotion.metric"] == "test_mse"
    # and its weights as a training package (docs/TRAINING_OUTSIDE_PYTHON.md), whatever the trainer
    assert export_run.data.tags["ortflow.training_package"] == "training_package"
    package = ortflow.package.TrainingPackage(mlflow.artifacts.download_artifacts(
        run_id=export_run.info.run_id, artifact_path="training_package"))
    assert package.manifest["metadata"]["run_id"] == export_run.info.run_id
    return parent, children


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["full", "fwbw"])
def test_default_chain_on_sqlite(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri, trainer):
    result = _chain(compose_pipeline, tmp_path, sqlite_uri, f"trainer={trainer}")
    client = MlflowClient(sqlite_uri)
    parent, children = _check_chain(client, result, trainer)
    # first version: nobody held the alias
    champion = client.get_model_version_by_alias(MODEL, "champion")
    assert str(champion.version) == "1" and champion.tags["ortflow.promotion.decision"] == "promoted"
    assert children["export"].data.tags["ortflow.promotion.decision"] == "promoted"
    # artifacts live under <root>/mlartifacts; the model loads back through the alias and predicts
    assert (tmp_path / "mlartifacts").is_dir() and (tmp_path / "mlflow.db").is_file()
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    X = pd.DataFrame(np.random.default_rng(0).normal(size=(4, 5)), columns=[f"x{i}" for i in range(5)])
    assert model.predict(X)["prediction"].shape == (4,)
    requirements = Path(mlflow.artifacts.download_artifacts(f"models:/{MODEL}@champion")) / "requirements.txt"
    text = requirements.read_text()
    # the deploy graph is plain ONNX: the plain onnxruntime serves it, whichever build trained it
    assert "onnxruntime>=" in text and "onnxruntime-training" not in text
    assert "mlflow ui --backend-store-uri sqlite:///" in report(result, compose_pipeline("experiment=smoke"))


@pytest.mark.slow
def test_default_chain_on_mlflow_server(compose_pipeline, clean_mlflow_env, tmp_path, mlflow_server):
    result = _chain(compose_pipeline, tmp_path, mlflow_server, "mlflow.experiment_name=server-chain",
                    "mlflow.registered_model_name=" + MODEL)
    client = MlflowClient(mlflow_server)
    _check_chain(client, result, "full")
    assert client.get_model_version_by_alias(MODEL, "champion") is not None
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlartifacts").exists()
    graph = Path(mlflow.artifacts.download_artifacts(f"models:/{MODEL}@champion")) / "artifacts" / "deploy_model.onnx"
    assert [o.name for o in onnx.load(str(graph)).graph.output] == ["variable"]
    assert result.tracking.ui_hint(result.run_id).startswith(f"open {mlflow_server}")


def test_promotion_both_ways(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri):
    client = MlflowClient(sqlite_uri)
    # every version registered, the kept ones too (the default, if_promoted, registers only those that take the alias)
    stages = "stages=[convert,add_loss,train,evaluate,export]", "promotion.register=always"
    first = _chain(compose_pipeline, tmp_path, sqlite_uri, *stages, name="first")
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == "1"

    # worse: one epoch at a tiny learning rate barely moves the weights of the 5-iteration sklearn start
    worse = _chain(compose_pipeline, tmp_path, sqlite_uri, *stages, "trainer.max_iter=1",
                   "trainer.learning_rate=1e-6", name="worse")
    assert worse.metrics["test_mse"] > first.metrics["test_mse"]
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == "1"
    v2 = client.get_model_version(MODEL, "2")
    assert v2.tags["ortflow.promotion.decision"] == "kept"
    assert float(v2.tags["ortflow.promotion.holder_value"]) == pytest.approx(first.metrics["test_mse"])
    assert float(v2.tags["ortflow.promotion.candidate_value"]) == pytest.approx(worse.metrics["test_mse"])
    run_tags = client.get_run(worse.stage_run_ids["export"]).data.tags
    assert run_tags["ortflow.promotion.decision"] == "kept" and run_tags["ortflow.promotion.holder_version"] == "1"

    # better: more epochs
    better = _chain(compose_pipeline, tmp_path, sqlite_uri, *stages, "trainer.max_iter=25",
                    "trainer.learning_rate=0.02", name="better")
    assert better.metrics["test_mse"] < first.metrics["test_mse"]
    champion = client.get_model_version_by_alias(MODEL, "champion")
    assert str(champion.version) == "3" and champion.tags["ortflow.promotion.decision"] == "promoted"
    assert champion.tags["ortflow.promotion.holder_version"] == "1"

    # a maximized metric: the R² of version 4 (same as version 3's settings) ties, so the alias stays
    _chain(compose_pipeline, tmp_path, sqlite_uri, *stages, "trainer.max_iter=25", "trainer.learning_rate=0.02",
           "promotion.metric=test_r2", name="tie")
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == "3"
    v4 = client.get_model_version(MODEL, "4")
    assert v4.tags["ortflow.promotion.direction"] == "maximize" and v4.tags["ortflow.promotion.decision"] == "kept"

    # other data (another seed, another test split): not comparable, never promoted however good it looks
    _chain(compose_pipeline, tmp_path, sqlite_uri, *stages, "seed=7", "trainer.max_iter=25", name="other-data")
    v5 = client.get_model_version(MODEL, "5")
    assert v5.tags["ortflow.promotion.decision"] == "kept"
    assert "other test data" in v5.tags["ortflow.promotion.reason"]
    assert v5.tags["ortflow.data_fingerprint"] != champion.tags["ortflow.data_fingerprint"]
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == "3"


def test_register_policies_keep_the_registry_to_what_they_name(compose_pipeline, clean_mlflow_env, tmp_path,
                                                               sqlite_uri):
    """``promotion.register``: if_promoted (the default) registers only a model that takes the alias; a worse one
    is logged, not registered, and its run says why; best_of_sweep registers no single chain."""
    client = MlflowClient(sqlite_uri)
    stages = "stages=[convert,add_loss,train,evaluate,export]"
    first = _chain(compose_pipeline, tmp_path, sqlite_uri, stages, name="first")
    assert first.metrics["registered_version"] == "1"

    worse = _chain(compose_pipeline, tmp_path, sqlite_uri, stages, "trainer.max_iter=1", "trainer.learning_rate=1e-6",
                   name="worse")
    assert worse.metrics["test_mse"] > first.metrics["test_mse"] and "registered_version" not in worse.metrics
    assert [str(v.version) for v in client.search_model_versions(f"name='{MODEL}'")] == ["1"]
    tags = client.get_run(worse.stage_run_ids["export"]).data.tags
    assert tags["ortflow.registered"].startswith("false (promotion.register=if_promoted: test_mse ")
    assert tags["ortflow.promotion.decision"] == "kept" and tags["ortflow.promotion.holder_version"] == "1"
    assert tags["ortflow.model_uri"].startswith("models:/")  # logged all the same
    assert client.get_run(worse.stage_run_ids["export"]).data.metrics["promoted"] == 0.0

    better = _chain(compose_pipeline, tmp_path, sqlite_uri, stages, "trainer.max_iter=25",
                    "trainer.learning_rate=0.02", name="better")
    assert better.metrics["test_mse"] < first.metrics["test_mse"]
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == better.metrics["registered_version"]

    alone = _chain(compose_pipeline, tmp_path, sqlite_uri, stages, "trainer.max_iter=25", "trainer.learning_rate=0.05",
                   "promotion.register=best_of_sweep", name="best-of-sweep")
    assert "registered_version" not in alone.metrics
    assert client.get_run(alone.stage_run_ids["export"]).data.tags["ortflow.registered"].startswith(
        "false (promotion.register=best_of_sweep")
    assert sorted(str(v.version) for v in client.search_model_versions(f"name='{MODEL}'")) == ["1", "2"]


def test_diverging_run_fails_with_reason_and_is_not_promoted(compose_pipeline, clean_mlflow_env, tmp_path,
                                                            sqlite_uri):
    with pytest.raises(ortflow.ConvergenceError):
        _chain(compose_pipeline, tmp_path, sqlite_uri, "trainer.learning_rate=1e4", "trainer.batch_size=8")
    client = MlflowClient(sqlite_uri)
    runs = client.search_runs([client.get_experiment_by_name("ortflow").experiment_id])
    by_stage = {r.data.tags.get("ortflow.stage", "parent"): r for r in runs}
    assert sorted(by_stage) == ["add_loss", "convert", "parent", "train"]  # evaluate/export never ran
    for name in ("train", "parent"):
        assert by_stage[name].info.status == "FAILED"
        assert "ConvergenceError" in by_stage[name].data.tags["ortflow.failure_reason"]
    assert by_stage["train"].data.tags["ortflow.diverged"] == "true"
    assert by_stage["convert"].info.status == "FINISHED"
    assert client.search_registered_models() == [] or not client.search_model_versions(f"name='{MODEL}'")


def test_stages_run_alone_from_run_ids_and_paths(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri, capsys):
    client = MlflowClient(sqlite_uri)
    base = ("experiment=smoke", f"mlflow.tracking_uri={sqlite_uri}", f"mlflow.root={tmp_path}")

    def latest(stage):
        runs = client.search_runs([client.get_experiment_by_name("ortflow").experiment_id],
                                  f"tags.`ortflow.stage` = '{stage}'", order_by=["start_time DESC"])
        return runs[0].info.run_id

    run_standalone("convert", convert, compose_pipeline(*base))
    assert f"source.run_id={latest('convert')}" in capsys.readouterr().out
    with pytest.raises(LookupError, match="model_with_loss"):  # train needs add_loss's output
        run_standalone("train", train, compose_pipeline(*base, f"source.run_id={latest('convert')}"))
    assert client.get_run(latest("train")).info.status == "FAILED"

    run_standalone("add_loss", add_loss, compose_pipeline(*base, f"source.run_id={latest('convert')}"))
    value = run_standalone("train", train, compose_pipeline(*base, f"source.run_id={latest('add_loss')}"))
    assert value == pytest.approx(client.get_run(latest("train")).data.metrics["best_validation_loss"], rel=1)
    run_standalone("evaluate", evaluate, compose_pipeline(*base, f"source.run_id={latest('train')}"))
    run_standalone("export", export, compose_pipeline(*base, f"source.run_id={latest('evaluate')}"))
    assert client.get_model_version_by_alias(MODEL, "champion").run_id == latest("export")
    runs = client.search_runs([client.get_experiment_by_name("ortflow").experiment_id])
    assert all("mlflow.parentRunId" not in r.data.tags for r in runs)  # alone: top-level runs

    # a stage can also start from files: a folder holding convert's outputs
    folder = tmp_path / "from-files"
    folder.mkdir()
    for name in ("graphs/model.onnx", "data/split.npz"):
        mlflow.artifacts.download_artifacts(run_id=latest("convert"), artifact_path=name, dst_path=str(folder))
    for path in folder.rglob("*.*"):
        path.rename(folder / path.name)
    run_standalone("add_loss", add_loss, compose_pipeline(*base, f"source.path={folder}", "loss=absolute"))
    manifest = json.loads(Path(mlflow.artifacts.download_artifacts(
        run_id=latest("add_loss"), artifact_path="manifest.json")).read_text())
    assert manifest["model_with_loss"]["uri"].startswith(f"runs:/{latest('add_loss')}/")


def test_tracking_costs_under_5_percent_of_a_100_epoch_run(compose_pipeline, clean_mlflow_env, tmp_path,
                                                           sqlite_uri):
    cfg = compose_pipeline(f"mlflow.tracking_uri={sqlite_uri}", f"mlflow.root={tmp_path}", "trainer.max_iter=100",
                           "stages=[convert,add_loss,train]")
    result = run_chain(cfg, work_dir=tmp_path / "w")
    client = MlflowClient(sqlite_uri)
    metrics = client.get_run(result.stage_run_ids["train"]).data.metrics
    assert len(client.get_metric_history(result.stage_run_ids["train"], "train_loss")) == 100
    # the epoch loop itself only appends to a list; the batched write overlaps the graph saving afterwards
    assert metrics["tracking_in_loop_fraction"] < 0.05, metrics
    assert metrics["tracking_overhead_fraction"] < 0.5, metrics


def test_file_data_parquet_classification_and_csv_regression(compose_pipeline, clean_mlflow_env, tmp_path,
                                                              sqlite_uri):
    import pandas as pd
    from sklearn.datasets import make_classification, make_regression

    X, y = make_classification(300, n_features=4, n_informative=3, n_redundant=1, class_sep=2.0, random_state=0)
    frame = pd.DataFrame(X, columns=list("abcd"))
    frame["label"] = np.where(y == 1, "yes", "no")  # string labels: the graph's classes, in sorted order
    frame["comment"] = "non-numeric columns are left out when asked"
    frame.to_parquet(tmp_path / "table.parquet")
    result = _chain(compose_pipeline, tmp_path, sqlite_uri, "data=file", f"data.path={tmp_path / 'table.parquet'}",
                    "data.target=label", "data.task=classification", "model=logistic", "loss=log",
                    "data.drop_invalid=true", "preprocess=none",  # numbers only: the text column dropped
                    "trainer.max_iter=10", "stages=[convert,add_loss,train,evaluate]", name="parquet")
    assert result.metrics["test_accuracy"] > 0.7 and result.metrics["test_roc_auc"] > 0.7
    client = MlflowClient(sqlite_uri)
    plots = client.list_artifacts(result.stage_run_ids["evaluate"], "plots")
    assert [f.path for f in plots] == ["plots/confusion_matrix.png", "plots/roc.png"]
    convert = client.get_run(result.stage_run_ids["convert"])
    assert convert.data.metrics["n_features"] == 4 and convert.data.metrics["n_columns_dropped"] == 1
    assert convert.data.tags["ortflow.dropped_columns"] == "comment"

    X, y = make_regression(250, n_features=3, noise=5.0, random_state=1)
    frame = pd.DataFrame(X, columns=["x1", "x2", "x3"]).assign(target=y)
    frame.to_csv(tmp_path / "table.csv", index=False)
    result = _chain(compose_pipeline, tmp_path, sqlite_uri, "data=file", f"data.path={tmp_path / 'table.csv'}",
                    "data.target=target", "data.features=[x1,x3]", "model=linear", "trainer.max_iter=5",
                    "stages=[convert,add_loss,train,evaluate]", name="csv")
    assert client.get_run(result.stage_run_ids["convert"]).data.metrics["n_features"] == 2
    assert math.isfinite(result.metrics["test_r2"])


def test_checkpoint_logged_and_training_resumed_from_it(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri):
    stages = "stages=[convert,add_loss,train]"
    first = _chain(compose_pipeline, tmp_path, sqlite_uri, stages, "trainer.max_iter=2", "trainer.checkpoint_every=1",
                   name="first")
    client = MlflowClient(sqlite_uri)
    train_run = first.stage_run_ids["train"]
    assert "checkpoint/trainer.json" in [f.path for f in client.list_artifacts(train_run, "checkpoint")]
    resumed = _chain(compose_pipeline, tmp_path, sqlite_uri, stages, "trainer.max_iter=4",
                     f"trainer.resume_from=runs:/{train_run}/checkpoint", name="resumed")
    history = client.get_metric_history(resumed.stage_run_ids["train"], "train_loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]  # the whole curve: epochs 1-2 from the checkpoint
    first_losses = {m.step: m.value for m in client.get_metric_history(train_run, "train_loss")}
    assert {m.step: m.value for m in history if m.step <= 2} == first_losses
    assert client.get_run(resumed.stage_run_ids["train"]).data.tags["ortflow.resumed_from"].endswith("/checkpoint")
