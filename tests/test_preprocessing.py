"""The library on a DataFrame (issue 41 item 3): ``ortflow.data.preprocessing`` gives library users the preprocessing the
pipelines build (``preprocess=auto``), text gaps included, and the README's example runs as written."""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LinearRegression
from sklearn.pipeline import make_pipeline

from ortflow import OrtGradientOptimizer, add_loss_output, to_onnx
from ortflow.data.preprocessing import TEXT_MISSING, column_kinds, make_preprocessing, prepare_frame

README = Path(__file__).resolve().parents[1] / "README.md"


def _frame(n=80, seed=0):
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"city": rng.choice(["Lyon", "Paris", None], n),
                          "sold": pd.date_range("2022-01-01", periods=n, freq="D"),
                          "rooms": rng.integers(1, 6, n),
                          "area": np.where(rng.random(n) < 0.1, np.nan, rng.normal(60, 15, n))})
    y = (frame.rooms * 0.5 + (frame.city == "Paris") + rng.normal(0, 0.1, n)).to_numpy(np.float32)
    return frame, y


def test_a_frame_with_text_gaps_trains_and_predicts_as_scikit_learn():
    """The issue: a text column with gaps failed fit; the graph from prepare_frame + make_preprocessing takes the
    gaps (their own category), an unseen city and a missing area, and predicts as the scikit-learn pipeline."""
    frame, y = _frame()
    X = prepare_frame(frame)
    kinds = column_kinds(X)
    assert kinds == {"city": "text", "sold": "date", "rooms": "number", "area": "number"}
    assert (X["city"] == TEXT_MISSING).any() and X["city"].notna().all()
    model = make_pipeline(make_preprocessing(kinds), LinearRegression()).fit(X, y)
    trainer = OrtGradientOptimizer(add_loss_output(to_onnx(model, X)), max_iter=1, learning_rate=1e-9).fit(X, y)
    new = prepare_frame(pd.DataFrame({"city": ["Paris", None, "Nice"], "sold": pd.to_datetime(["2023-05-01"] * 3),
                                      "rooms": [3, 2, 1], "area": [55.0, np.nan, 70.0]}), kinds=kinds)
    expected = model.predict(new)
    # float32 graph: the terms of the sum are the standardized features times the coefficients
    terms = np.abs(model[-1].coef_).sum() * 10 + abs(model[-1].intercept_)
    np.testing.assert_allclose(trainer.predict(new).ravel(), expected, atol=50 * np.finfo(np.float32).eps * terms)


def test_prepare_frame_names_a_cell_that_is_not_a_number():
    frame, _ = _frame(10)
    with pytest.raises(ValueError, match=r"column 'rooms' of the frame is numbers but for 1 of 10 cells \('three' at row 1"):
        prepare_frame(frame.assign(rooms=["three"] + [1] * 9), treatments={"rooms": "scale"})
    with pytest.raises(ValueError, match="treatment 'zscore' is not one of"):
        make_preprocessing({"rooms": "number"}, {"rooms": "zscore"})


def test_readme_table_example_runs():
    text = README.read_text()
    section = text[text.index("## The library on a table"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own example
    predictions = namespace["trainer"].predict(prepare_frame(namespace["new_rows"], kinds=namespace["kinds"]))
    assert predictions.shape[0] == 2 and np.isfinite(predictions).all()
    losses = namespace["trainer"].train_losses_
    assert losses[-1] < losses[0]
