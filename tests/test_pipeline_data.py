"""Your own data (``data=file``): the name, what is refused, what ``data.drop_invalid=true`` drops and reports."""

import logging
import re

import numpy as np
import pandas as pd
import pytest

from pipelines.base.checks import validate

from pipelines.base.schema import ConfigError
from pipelines.data.datasets import load_dataset
from pipelines.base.errors import DataError
from pipelines.tracking.lineage import logged_model_name
from pipelines.data.tables import read_table


def _table(tmp_path, frame, name="houses.csv"):
    path = tmp_path / name
    frame.to_parquet(path) if name.endswith(".parquet") else frame.to_csv(path, index=False)
    return path


def _frame(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"area": rng.normal(100, 20, n), "rooms": rng.integers(1, 6, n).astype(float),
                         "price": rng.normal(300, 50, n)})


def _data(compose_pipeline, path, *overrides):
    return compose_pipeline("data=file", f"data.path={path}", "data.target=price", "model=linear", *overrides).data


def test_name_is_free_text_and_names_the_registered_model(compose_pipeline, tmp_path):
    path = _table(tmp_path, _frame(), "my houses 2024.csv")
    cfg = compose_pipeline("data=file", f"data.path={path}", "data.target=price", "model=linear")
    assert cfg.data.name == "my_houses_2024"  # the file's name by default
    assert re.fullmatch(r"ortflow-my_houses_2024-linear-price-[0-9a-f]{8}", cfg.mlflow.registered_model_name)
    validate(cfg)
    cfg = compose_pipeline("data=file", f"data.path={path}", "data.target=price", "model=linear",
                           "data.name=house-prices")
    assert re.fullmatch(r"ortflow-house-prices-linear-price-[0-9a-f]{8}", cfg.mlflow.registered_model_name)
    assert logged_model_name(cfg) == cfg.mlflow.registered_model_name  # the exported model's LoggedModel
    # a built-in loader under another name: data.loader picks it
    cfg = compose_pipeline("data=diabetes", "model=linear", "data.name=diabetes-v2")
    validate(cfg)
    X, y, names = load_dataset(cfg.data)
    assert X.shape == (442, 10) and names[0] == "age"


def test_another_problem_on_the_same_file_gets_another_registered_model(compose_pipeline, tmp_path):
    """Seen: the default registered-model name (``ortflow-<file stem>-<model>``) was one for the same file with
    another target, another format (CSV or Parquet) or fewer features, so a feature-selection run compared itself
    with the champion of all the features and never registered by default. The name adds the target and a digest
    of the problem: a rerun of one problem keeps its name, each other problem gets its own (the comparable-data
    gate of a model's versions stays as it was)."""
    frame = _frame()
    csv, parquet = _table(tmp_path, frame), _table(tmp_path, frame, "houses.parquet")

    def name(path, *overrides, data="file"):
        return str(compose_pipeline(f"data={data}", f"data.path={path}", "model=linear", *overrides)
                   .mlflow.registered_model_name)

    base = name(csv, "data.target=price")
    assert base == name(csv, "data.target=price") and base.startswith("ortflow-houses-linear-price-")
    others = {"another target": name(csv, "data.target=rooms"),
              "another format": name(parquet, "data.target=price"),
              "a stream of it": name(parquet, "data.target=price", data="parquet"),
              "fewer features": name(csv, "data.target=price", "data.features=[area]"),
              "another task": name(csv, "data.target=rooms", "data.task=classification")}
    assert base not in others.values() and len(set(others.values())) == len(others), others
    # the same features listed in another order are the same problem
    assert name(csv, "data.target=price", "data.features=[area,rooms]") == \
        name(csv, "data.target=price", "data.features=[rooms,area]")
    assert compose_pipeline("data=diabetes", "model=linear").mlflow.registered_model_name == "ortflow-diabetes-linear"


@pytest.mark.parametrize("overrides,words", [
    (["data.name=a/b"], ["data.name='a/b'", "letters"]),
    (["data=regression", "data.name=houses", "data.loader=null"], ["data.name='houses'", "data=file"]),
])
def test_bad_names_fail_naming_the_key(compose_pipeline, overrides, words):
    cfg = compose_pipeline("model=mlp_regressor", *overrides)
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    for word in words:
        assert word in str(info.value)


def test_non_numeric_column_refused_by_default_dropped_when_asked(compose_pipeline, tmp_path, caplog):
    frame = _frame().assign(city="Paris")
    path = _table(tmp_path, frame, "houses.parquet")
    with pytest.raises(DataError, match=r"non-numeric columns \['city'\].*data.drop_invalid=true"):
        read_table(_data(compose_pipeline, path))
    with caplog.at_level(logging.WARNING, logger="pipelines.data.tables"):
        table = read_table(_data(compose_pipeline, path, "data.drop_invalid=true"))
    assert table.features == ["area", "rooms"] and table.dropped_columns == ["city"]
    assert table.report() == {"n_rows_read": 40, "n_rows_dropped": 0, "n_columns_dropped": 1,
                              "dropped_columns": "city"}
    assert "non-numeric columns left out: ['city']" in caplog.text
    np.testing.assert_array_equal(table.X, frame[["area", "rooms"]].to_numpy())
    with pytest.raises(DataError, match=r"data.features names non-numeric columns \['city'\]"):
        read_table(_data(compose_pipeline, path, "data.features=[area,city]", "data.drop_invalid=true"))


def test_rows_with_missing_or_infinite_values_refused_by_default_dropped_when_asked(compose_pipeline, tmp_path, caplog):
    frame = _frame()
    frame.loc[3, "area"] = np.nan
    frame.loc[7, "price"] = np.nan
    frame.loc[9, "rooms"] = np.inf
    path = _table(tmp_path, frame)
    with pytest.raises(DataError) as info:
        read_table(_data(compose_pipeline, path))
    assert "3 of 40 rows of houses.csv" in str(info.value) and "['area', 'rooms', 'price']" in str(info.value)
    assert "first at data row 4" in str(info.value) and "data.drop_invalid=true" in str(info.value)
    with caplog.at_level(logging.WARNING, logger="pipelines.data.tables"):
        table = read_table(_data(compose_pipeline, path, "data.drop_invalid=true"))
    assert len(table.y) == 37 and table.n_rows_dropped == 3 and table.report()["n_rows_read"] == 40
    np.testing.assert_array_equal(table.y, frame["price"].drop(index=[3, 7, 9]).to_numpy())
    assert "3 of 40 rows dropped" in caplog.text


@pytest.mark.parametrize("change,overrides,message", [
    (lambda f: f, ["data.target=cost"], r"data.target='cost' is not a column of houses.csv; its columns: \['area'"),
    (lambda f: f, ["data.features=[area,floor]"], r"names columns \['floor'\] missing"),
    (lambda f: f.assign(price="high"), [], r"data.target='price' of houses.csv holds text \('high'"),
    (lambda f: f.head(6), [], r"6 usable rows: at least 10"),
])
# (classification labels are checked for every data set by pipelines.data.labels: tests/test_pipeline_classification.py)
def test_unusable_targets_and_columns_fail_naming_them(compose_pipeline, tmp_path, change, overrides, message):
    path = _table(tmp_path, change(_frame()))
    with pytest.raises(DataError, match=message):
        read_table(_data(compose_pipeline, path, *overrides))


def test_missing_file_and_unknown_suffix(compose_pipeline, tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_table(_data(compose_pipeline, tmp_path / "none.csv"))
    (tmp_path / "table.xlsx").write_text("x")
    with pytest.raises(DataError, match="use a .csv or .parquet file"):
        read_table(_data(compose_pipeline, tmp_path / "table.xlsx"))


def test_text_labels_classify(compose_pipeline, tmp_path):
    frame = _frame(60).assign(price=["cheap", "dear", "mid"] * 20)
    table = read_table(_data(compose_pipeline, _table(tmp_path, frame), "data.task=classification"))
    assert sorted(set(table.y)) == ["cheap", "dear", "mid"] and table.y.dtype.kind == "U"
