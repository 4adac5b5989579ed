"""Classification of any number of classes through the pipelines: iris and digits configs, the evaluate stage's
metrics and plots, label sets refused before any run is created."""

import math

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score, log_loss

from pipelines.orchestration.chain import run_chain
from pipelines.base.errors import DataError
from pipelines.data.datasets import Split, make_split


def _no_runs(uri: str) -> bool:
    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return not experiments or not client.search_runs(experiments)


@pytest.mark.slow
def test_iris_chain_logs_multiclass_metrics_and_plots(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri):
    cfg = compose_pipeline("experiment=iris_logistic", f"mlflow.tracking_uri={sqlite_uri}", f"mlflow.root={tmp_path}",
                           "stages=[convert,add_loss,train,evaluate]")
    result = run_chain(cfg, work_dir=tmp_path / "iris")
    client = MlflowClient(sqlite_uri)
    evaluate_id = result.stage_run_ids["evaluate"]
    metrics = client.get_run(evaluate_id).data.metrics

    # the numbers against scikit-learn's on the same test rows, recomputed from the logged deploy graph
    split = Split.load(client.download_artifacts(result.stage_run_ids["convert"], "data/split.npz", str(tmp_path)))
    assert split.classes.tolist() == [0, 1, 2] and split.y_test.dtype == np.int64  # labels as iris has them
    import onnxruntime

    session = onnxruntime.InferenceSession(
        client.download_artifacts(evaluate_id, "graphs/deploy_model.onnx", str(tmp_path)),
        providers=["CPUExecutionProvider"])
    label, proba = session.run(["output_label", "output_probability"], {"X": split.raw_X(split.X_test)})
    assert metrics["test_accuracy"] == pytest.approx(accuracy_score(split.y_test, label))
    assert metrics["test_f1_macro"] == pytest.approx(f1_score(split.y_test, label, average="macro"))
    assert metrics["test_log_loss"] == pytest.approx(log_loss(split.y_test, proba), rel=1e-5)
    for c in (0, 1, 2):
        assert {f"test_precision_class_{c}", f"test_recall_class_{c}", f"test_f1_class_{c}"} <= set(metrics)
    assert math.isfinite(metrics["test_roc_auc"]) and math.isfinite(metrics["sklearn_test_log_loss"])
    # trained from one scikit-learn iteration, it reaches a fully fitted scikit-learn model's accuracy - 0.02
    reference = LogisticRegression(max_iter=1000).fit(split.X_train, split.y_train)
    assert metrics["test_accuracy"] >= reference.score(split.X_test, split.y_test) - 0.02
    plots = [f.path for f in client.list_artifacts(evaluate_id, "plots")]
    assert plots == ["plots/confusion_matrix.png", "plots/roc.png"]


def test_digits_config_keeps_ten_classes(compose_pipeline):
    split = make_split(compose_pipeline("experiment=digits_mlp").data)
    assert split.classes.tolist() == list(range(10)) and split.n_features == 64
    assert set(np.unique(split.y_test)) == set(range(10))  # stratified


def _table_config(compose_pipeline, tmp_path, labels, *overrides):
    frame = pd.DataFrame(np.random.default_rng(0).normal(size=(len(labels), 3)), columns=list("abc")).assign(y=labels)
    frame.to_csv(tmp_path / "table.csv", index=False)
    return compose_pipeline("data=file", f"data.path={tmp_path / 'table.csv'}", "data.target=y",
                            "data.task=classification", "model=logistic", "loss=log", *overrides)


def test_a_single_class_is_refused_before_any_run(compose_pipeline, clean_mlflow_env, tmp_path, sqlite_uri):
    cfg = _table_config(compose_pipeline, tmp_path, np.full(60, 3), f"mlflow.tracking_uri={sqlite_uri}",
                        f"mlflow.root={tmp_path}")
    with pytest.raises(DataError, match=r"data.target='y' of table.csv holds one label \('3'\): a classifier needs "
                                        r"at least two"):
        run_chain(cfg, work_dir=tmp_path / "chain")
    assert _no_runs(sqlite_uri)


@pytest.mark.parametrize("labels, message", [
    (np.linspace(0.0, 10.0, 60), "holds non-integral numbers ([0.1694915254237288"),
    (np.arange(60), "have fewer than 3 rows: every class needs that many for the stratified train/validation/test "
                    "split (a regression target? for a continuous target set data.task=regression"),
    (np.arange(120) % 101, "holds 101 distinct values: not labels (at most 100 classes)"),
])
def test_label_sets_a_classifier_cannot_learn_are_named(compose_pipeline, tmp_path, labels, message):
    with pytest.raises(DataError, match="data.target='y' of table.csv") as info:
        make_split(_table_config(compose_pipeline, tmp_path, labels).data)
    assert message in str(info.value)


def test_string_and_shifted_labels_are_kept(compose_pipeline, tmp_path):
    split = make_split(_table_config(compose_pipeline, tmp_path, np.repeat(["cat", "dog", "emu"], 20)).data)
    assert split.classes.tolist() == ["cat", "dog", "emu"] and set(split.y_train) == {"cat", "dog", "emu"}
    split = make_split(_table_config(compose_pipeline, tmp_path, np.repeat([-1.0, 1.0, 2.0], 20)).data)
    assert split.classes.tolist() == [-1, 1, 2] and split.y_test.dtype == np.int64


def test_a_regression_set_as_classification_is_refused_naming_it(compose_pipeline):
    cfg = compose_pipeline("data=diabetes", "data.task=classification", "model=logistic", "loss=log")
    with pytest.raises(DataError, match="the target of data=diabetes holds 214 distinct values: not labels"):
        make_split(cfg.data)


@pytest.mark.slow
def test_torch_trainer_learns_three_classes_with_their_labels():
    pytest.importorskip("torch")
    import ortflow
    from sklearn.datasets import load_iris

    from ortflow import TorchTrainer

    X, y = load_iris(return_X_y=True)
    X = ((X - X.mean(axis=0)) / X.std(axis=0)).astype(np.float32)
    labels = np.array([10, 20, 30])[y]  # any labels: mapped through the graph's classes
    graph = ortflow.to_onnx(LogisticRegression(max_iter=1).fit(X, labels))
    trainer = TorchTrainer(graph, learning_rate=ortflow.LearningRateAdam(eta0=0.1), learning_loss="log", max_iter=12,
                           batch_size=32)
    trainer.fit(X, labels, validation_data=(X[:30], labels[:30]))
    assert trainer.train_losses_[-1] < 0.3 * trainer.train_losses_[0]
    import onnxruntime

    session = onnxruntime.InferenceSession(trainer.get_trained_onnx().SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    predicted = session.run(["output_label"], {"X": X})[0]
    assert set(predicted) <= {10, 20, 30} and (predicted == labels).mean() >= 0.9
