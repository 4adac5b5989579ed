"""Your own table as it is (``preprocess=auto``, the default of ``data=file``): text, integer, boolean and date
columns with gaps train without ``data.drop_invalid``; the registered model takes the raw columns (strings, gaps,
ISO dates) from ``mlflow.pyfunc`` and from ``mlflow models serve``, and both answer alike."""

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipelines.data.tables import TEXT_MISSING, read_table

REPO = Path(__file__).resolve().parent.parent


def _houses(n=300, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "city": rng.choice(["paris", "lyon", "nice"], n),
        "rooms": rng.integers(1, 6, n),
        "garden": rng.random(n) < 0.4,
        "area": rng.normal(70, 20, n).round(1),
        "sold": (pd.Timestamp("1965-01-01") + pd.to_timedelta(rng.integers(0, 20000, n), unit="D"))
        .strftime("%Y-%m-%d"),
    })
    frame["price"] = (2 * frame.area + 30 * (frame.city == "paris") + 10 * frame.rooms + 5 * frame.garden
                      + rng.normal(0, 5, n)).round(2)
    frame["kind"] = np.where(frame.price > frame.price.median(), "expensive", "cheap")
    frame.loc[::7, "area"] = np.nan
    frame.loc[::11, "city"] = None
    frame.loc[::13, "sold"] = None
    return frame


def test_a_table_is_read_as_it_is(compose_pipeline, tmp_path):
    _houses().drop(columns="kind").to_csv(tmp_path / "houses.csv", index=False)
    cfg = compose_pipeline("data=file", f"data.path={tmp_path / 'houses.csv'}", "data.target=price", "model=linear")
    assert str(cfg.preprocess.name) == "auto"
    table = read_table(cfg.data, cfg.preprocess)
    X = table.X
    assert list(X.columns) == ["city", "rooms", "garden", "area", "sold"]
    assert X.sold.dtype.kind == "M" and X.sold.isna().sum() == len(X[::13])
    assert X.city[0] == TEXT_MISSING and X.city.map(type).eq(str).all()
    assert X.rooms.dtype == np.float64 and X.garden.isin([0.0, 1.0]).all() and X.area.isna().any()
    # a treatment per column: dropped, or the integers as categories
    cfg = compose_pipeline("data=file", f"data.path={tmp_path / 'houses.csv'}", "data.target=price", "model=linear",
                           "+preprocess.columns.sold=drop", "+preprocess.columns.rooms=onehot")
    table = read_table(cfg.data, cfg.preprocess)
    assert list(table.X.columns) == ["city", "rooms", "garden", "area"] and table.dropped_columns == ["sold"]
    assert sorted(table.X.rooms.unique()) == ["1", "2", "3", "4", "5"]
    # numbers only (preprocess=none): the text column stops the command, as before
    from pipelines.base.errors import DataError

    with pytest.raises(DataError, match=r"non-numeric columns \['city', 'sold'\]"):
        read_table(cfg.data, compose_pipeline("preprocess=none").preprocess)


def test_a_number_beyond_float32_is_refused_naming_it(compose_pipeline, tmp_path):
    from pipelines.base.errors import DataError

    frame = _houses().drop(columns="kind")
    frame.loc[4, "area"] = 1e200
    frame.to_csv(tmp_path / "houses.csv", index=False)
    cfg = compose_pipeline("data=file", f"data.path={tmp_path / 'houses.csv'}", "data.target=price", "model=linear")
    with pytest.raises(DataError, match=r"column 'area' of houses.csv holds 1e\+200 at data row 5: beyond float32"):
        read_table(cfg.data, cfg.preprocess)


def test_a_treatment_outside_the_list_is_refused(compose_pipeline, tmp_path):
    from pipelines.base.checks import check_preprocess
    from pipelines.base.schema import ConfigError

    cfg = compose_pipeline("+preprocess.columns.city=embed")
    with pytest.raises(ConfigError, match=r"preprocess.columns \{'city': 'embed'\}: each column's treatment is one"):
        check_preprocess(cfg.preprocess)


def test_the_preprocessing_converts_as_scikit_learn_computes(tmp_path):
    """Each treatment in ONNX gives scikit-learn's numbers (the graph's front, frozen while training)."""
    import ortflow
    from ortflow._ort import InferenceSession
    from ortflow.data.inputs import InputMapping
    from pipelines.data.tables import column_kind, table_frame
    from pipelines.modeling.estimators import build_preprocessing

    treatments = {"rooms": "ordinal", "garden": "passthrough"}
    raw = _houses().drop(columns=["price", "kind"])
    kinds = {c: column_kind(raw[c], treatments.get(c)) for c in raw.columns}
    frame = table_frame(raw, treatments)
    assert kinds == {"city": "text", "rooms": "text", "garden": "bool", "area": "number", "sold": "date"}
    pre = build_preprocessing(kinds, treatments).fit(frame)
    from sklearn.linear_model import LinearRegression
    from sklearn.pipeline import make_pipeline

    pipe = make_pipeline(pre, LinearRegression()).fit(frame, np.arange(len(frame), dtype=float))
    onx = ortflow.to_onnx(pipe, frame)
    unseen = frame.assign(city=["lille"] * len(frame))  # unknown categories: ignored
    for rows in (frame, unseen):
        feeds = InputMapping.of(onx).feeds(rows)[0]
        out = InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        np.testing.assert_allclose(out.ravel(), pipe.predict(rows), rtol=1e-4, atol=1e-3 * len(frame))


def _main(folder: Path, *overrides: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ORTFLOW_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "pipelines.main", *overrides], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_a_raw_csv_trains_registers_and_is_served_as_it_is(tmp_path, clean_mlflow_env):
    """``python -m pipelines.main data=file data.path=houses.csv data.target=...`` on text, integers, booleans,
    dates and gaps, no drop_invalid; pyfunc and ``mlflow models serve`` answer the raw CSV alike."""
    import mlflow

    from pipelines.server import ModelServer

    frame = _houses()
    frame.to_csv(tmp_path / "houses.csv", index=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = _main(tmp_path, "data=file", "data.path=houses.csv", "data.target=price", "+preprocess.columns.kind=drop",
                "model=linear", "trainer.max_iter=20")
    regressor_name = re.search(r"model: models:/(ortflow-houses-linear-price-[0-9a-f]{8})/1 \(promoted", out)[1]
    out = _main(tmp_path, "data=file", "data.path=houses.csv", "data.target=kind", "data.task=classification",
                "+preprocess.columns.price=drop", "model=logistic", "loss=log", "trainer.max_iter=20")
    classifier_name = re.search(r"model: models:/(ortflow-houses-logistic-kind-[0-9a-f]{8})/1 \(promoted", out)[1]
    mlflow.set_tracking_uri(uri)
    raw = pd.read_csv(tmp_path / "houses.csv")
    assert raw.rooms.dtype == np.int64 and raw.garden.dtype == bool
    regressor = mlflow.pyfunc.load_model(f"models:/{regressor_name}@champion")
    predictions = regressor.predict(raw.drop(columns=["price", "kind"]))["prediction"].to_numpy()
    assert np.corrcoef(predictions, raw.price)[0, 1] > 0.9
    classifier = mlflow.pyfunc.load_model(f"models:/{classifier_name}@champion")
    labels = classifier.predict(raw.drop(columns=["price", "kind"])).to_numpy()
    assert (labels == raw.kind.to_numpy()).mean() > 0.8
    shuffled = raw[["sold", "kind", "area", "garden", "price", "rooms", "city"]]  # any order, extra columns ignored
    np.testing.assert_array_equal(regressor.predict(shuffled)["prediction"].to_numpy(), predictions)

    server = ModelServer(tmp_path / "serve", f"models:/{regressor_name}@champion", uri)
    server.start(timeout=180)
    try:
        split = raw.drop(columns=["price", "kind"]).to_dict(orient="split", index=False)
        split["data"] = [[None if isinstance(v, float) and np.isnan(v) else v for v in row] for row in split["data"]]
        import urllib.request

        request = urllib.request.Request(f"{server.url}/invocations", headers={"Content-Type": "application/json"},
                                         data=json.dumps({"dataframe_split": split}).encode())
        with urllib.request.urlopen(request, timeout=60) as response:
            served = [row["prediction"] for row in json.loads(response.read())["predictions"]]
        np.testing.assert_allclose(served, predictions, rtol=1e-6)
        request = urllib.request.Request(f"{server.url}/invocations", headers={"Content-Type": "text/csv"},
                                         data=(tmp_path / "houses.csv").read_bytes())
        with urllib.request.urlopen(request, timeout=60) as response:
            served = [row["prediction"] for row in json.loads(response.read())["predictions"]]
        np.testing.assert_allclose(served, predictions, rtol=1e-6)
    finally:
        server.stop()
