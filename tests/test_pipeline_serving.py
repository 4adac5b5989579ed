"""The registered model is safe to call: a column-based signature with the data's feature names, columns matched
by name and cast, outputs named for what they are, an input example that round-trips, and the same answers from
``mlflow.pyfunc`` and from ``mlflow models serve`` (a real process) as from the trained estimator."""

import json
import os
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlflow
import numpy as np
import onnxruntime
import pandas as pd
import pytest
from mlflow import MlflowClient

from pipelines.orchestration.chain import run_chain
from pipelines.data.datasets import Split
from pipelines.server import ModelServer

REGRESSOR = "ortflow-smoke-regression-mlp_regressor"
CLASSIFIER = "ortflow-digits-mlp_classifier"


def _trained_answers(client: MlflowClient, name: str, folder: Path) -> tuple[Split, dict[str, np.ndarray]]:
    """What the trained estimator predicts on the test rows: its trained graph on the standardized rows (the
    deploy graph is not used), regression outputs brought back to the target's units."""
    export_run = client.get_run(client.get_model_version_by_alias(name, "champion").run_id)
    parent = client.get_run(export_run.data.tags["mlflow.parentRunId"]).data.tags
    split = Split.load(client.download_artifacts(parent["ortflow.run.convert"], "data/split.npz", str(folder)))
    graph = client.download_artifacts(parent["ortflow.run.train"], "graphs/trained_model.onnx", str(folder))
    session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"X": split.X_test})))
    if split.task == "regression":
        return split, {"prediction": outputs["variable"].ravel() * split.y_scale + split.y_mean}
    return split, {"label": outputs["output_label"], "probabilities": outputs["output_probability"]}


def _raw_frame(split: Split, rng: np.random.Generator) -> pd.DataFrame:
    """The test rows as a user has them: raw float64 values, named columns in a shuffled order."""
    names = [str(f) for f in split.feature_names]
    frame = pd.DataFrame(split.raw_X(split.X_test).astype(np.float64), columns=names)
    return frame[list(rng.permutation(names))]


def _check(answers, expected: dict[str, np.ndarray]) -> None:
    frame = pd.DataFrame(answers)
    assert sorted(frame.columns) == sorted(expected)
    if "prediction" in expected:
        np.testing.assert_allclose(frame["prediction"].to_numpy(np.float64), expected["prediction"], rtol=1e-4,
                                   atol=1e-3)
    else:
        np.testing.assert_array_equal(frame["label"].to_numpy(), expected["label"])
        np.testing.assert_allclose(np.stack(frame["probabilities"].to_numpy()), expected["probabilities"],
                                   atol=1e-5)


def _post(url: str, body: bytes, content_type: str) -> list[dict]:
    request = urllib.request.Request(f"{url}/invocations", data=body, headers={"Content-Type": content_type})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["predictions"]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A store holding a regressor (the smoke chain, in process) and a ten-class classifier (the digits
    experiment, run as users run it: ``python -m pipelines.main experiment=digits_mlp`` in their folder), each
    served by ``mlflow models serve``."""
    with pytest.MonkeyPatch.context() as patch:  # module scope: set up before any test's clean_mlflow_env
        for name in [k for k in os.environ if k.startswith(("MLFLOW_", "ORTFLOW_"))]:
            patch.delenv(name)  # an earlier test's chain may have left its store in the environment
        yield from _registry(tmp_path_factory.mktemp("registry"))


def _registry(folder: Path):
    from hydra import compose, initialize_config_dir

    from pipelines.base.config import CONFIG_DIR, register_configs

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ORTFLOW_"))}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent) + os.pathsep + env.get("PYTHONPATH", "")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    proc = subprocess.run([sys.executable, "-m", "pipelines.main", "experiment=digits_mlp"], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"model: models:/{CLASSIFIER}/1 (promoted @champion" in proc.stdout
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["experiment=smoke", f"mlflow.tracking_uri={uri}", f"mlflow.root={folder}"])
    run_chain(cfg, work_dir=folder / "smoke")
    while mlflow.active_run() is not None:
        mlflow.end_run()
    servers = {name: ModelServer(folder / f"serve-{name}", f"models:/{name}@champion", uri)
               for name in (REGRESSOR, CLASSIFIER)}
    try:
        with ThreadPoolExecutor(len(servers)) as pool:  # both start at once: most of their start is imports
            list(pool.map(lambda server: server.start(timeout=180), servers.values()))
        yield folder, uri, {name: server.url for name, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("name", [REGRESSOR, CLASSIFIER])
def test_registered_model_answers_as_the_trained_estimator(registry, clean_mlflow_env, name):
    folder, uri, urls = registry
    client = MlflowClient(uri)
    split, expected = _trained_answers(client, name, folder / name)
    rng = np.random.default_rng(0)
    model_uri = f"models:/{name}@champion"

    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(model_uri)
    # the signature: one float64 column per feature, named as in the data; outputs named for what they are
    inputs = model.metadata.get_input_schema()
    assert inputs.input_names() == [str(f) for f in split.feature_names]
    assert {t.name for t in inputs.input_types()} == {"double"}
    outputs = model.metadata.get_output_schema().input_names()
    assert outputs == (["prediction"] if split.task == "regression" else ["label", "probabilities"])

    # in process: a plain pandas frame with shuffled columns, and the same rows as int32 and float32 columns
    _check(model.predict(_raw_frame(split, rng)), expected)
    rounded = _raw_frame(split, rng).round()
    reference = model.predict(rounded[[str(f) for f in split.feature_names]])
    for dtype in (np.int32, np.float32):
        pd.testing.assert_frame_equal(model.predict(rounded.astype(dtype)), reference)
    # the input example round-trips: the stored one is the first test rows, named, and predicts as they do
    local = Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=str(folder / f"{name}-model")))
    example = model.metadata.load_input_example(str(local))
    assert list(example.columns) == [str(f) for f in split.feature_names] and len(example) == 5
    _check(model.predict(example), {k: v[:5] for k, v in expected.items()})
    payload = json.loads((local / "serving_input_example.json").read_text())
    assert payload["dataframe_split"]["columns"] == list(example.columns)

    # served by `mlflow models serve --env-manager local`: JSON dataframe_split and a CSV body, columns shuffled
    frame = _raw_frame(split, rng)
    body = json.dumps({"dataframe_split": frame.to_dict(orient="split", index=False)}).encode()
    _check(_post(urls[name], body, "application/json"), expected)
    _check(_post(urls[name], _raw_frame(split, rng).to_csv(index=False).encode(), "text/csv"), expected)
    _check(_post(urls[name], json.dumps(payload).encode(), "application/json"), {k: v[:5] for k, v in expected.items()})
