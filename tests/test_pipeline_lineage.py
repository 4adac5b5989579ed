"""Lineage: the dataset inputs a stage logs (the chain's inputs, source tags and system metrics are checked on the
chain docs/PIPELINES.md documents, in tests/test_pipeline_docs.py)."""

import numpy as np
import pandas as pd


def test_split_datasets_hold_raw_features_and_original_labels(compose_pipeline, tmp_path):
    from pipelines.data.datasets import make_split
    from pipelines.tracking.lineage import split_datasets

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
