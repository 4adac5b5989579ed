"""Untrusted files handed to the pipelines: a model whose external data points outside its folder, a run
manifest whose entry names would escape the download folder."""

import json

import mlflow
import numpy as np
import pytest

from ortflow import UnsafePathError
from pipelines.execution.bundle import Bundle


def test_source_model_with_external_data_outside_its_folder_is_refused(model_with_outside_data):
    folder = model_with_outside_data
    bundle = Bundle.from_path(folder)  # what `python -m pipelines.add_loss source.path=<folder>` reads
    with pytest.raises(UnsafePathError, match="outside the model's folder"):
        bundle.load_onnx("model", "add_loss")


def test_run_manifest_entries_cannot_name_paths_outside_the_download_folder(tmp_path, clean_mlflow_env, sqlite_uri):
    mlflow.set_tracking_uri(sqlite_uri)
    mlflow.set_experiment(experiment_id=mlflow.MlflowClient(sqlite_uri).create_experiment(
        "files", artifact_location=(tmp_path / "artifacts").as_uri()))
    manifest = tmp_path / "manifest.json"
    with mlflow.start_run() as run:
        np.savez(tmp_path / "split.npz", a=np.zeros(1))
        mlflow.log_artifact(str(tmp_path / "split.npz"))
        manifest.write_text(json.dumps({
            "split": {"uri": f"runs:/{run.info.run_id}/split.npz"},
            "../../escape": {"uri": f"runs:/{run.info.run_id}/split.npz"},
            "unknown": {"uri": f"runs:/{run.info.run_id}/split.npz"},
        }))
        mlflow.log_artifact(str(manifest))
    bundle = Bundle.from_run(run.info.run_id)
    assert sorted(bundle.entries) == ["split"]
    path = bundle.path("split", "train")
    assert path.name == "split.npz" and path.parent.name == "split" and path.exists()
