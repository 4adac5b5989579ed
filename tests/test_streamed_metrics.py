"""Classification metrics over a test part streamed chunk by chunk, in memory that does not grow with its rows
(pipelines/modeling/metrics.py): the tally agrees with scikit-learn's metrics, its ROC AUC within the bound its
histograms give, and StreamedMetrics keeps the exact rows only up to ``exact_rows``."""

import numpy as np
import pytest

from pipelines.modeling.metrics import ClassificationTally, StreamedMetrics, classification_metrics


def _scored(n: int, k: int, seed: int = 0):
    """Labels and float32 probabilities that carry some signal, with exact ties (a quarter of the rows scored as
    the next quarter), saturated rows (probability 1 and 0) and a -0.0."""
    rng = np.random.default_rng(seed)
    classes = np.array([f"c{i}" for i in range(k)])
    logits = rng.normal(size=(n, k)) * 2
    y = classes[np.argmax(logits + rng.normal(scale=2.0, size=(n, k)), axis=1)]
    proba = np.exp(logits)
    proba = proba / proba.sum(axis=1, keepdims=True)
    proba[: n // 4] = proba[n // 4: n // 2]  # rows of other labels share their scores exactly
    proba[n // 2: n // 2 + 50] = np.eye(k)[0]  # saturated
    proba = proba.astype(np.float32)
    proba[-1, 0], proba[-1, 1:] = -0.0, 1.0 / (k - 1)
    return y, proba, classes


@pytest.mark.parametrize("k", [2, 3, 6])
def test_the_tally_gives_scikit_learns_metrics_and_its_auc_within_its_bound(k):
    y, proba, classes = _scored(60_000, k)
    expected = classification_metrics(y, proba, classes, per_class=True)
    tally = ClassificationTally(classes)
    for start in range(0, len(y), 7_000):
        tally.update(y[start:start + 7_000], proba[start:start + 7_000])
    got = tally.result(per_class=True)
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        if name == "test_roc_auc":
            # the bins merge scores closer than 2^-13..2^-10 relative: at most half the pairs sharing a bin
            assert abs(got[name] - value) <= tally.auc_bound() + 1e-12, (name, got[name], value, tally.auc_bound())
        else:  # counts and a float64 sum of len(y) terms, summed in another order
            assert got[name] == pytest.approx(value, rel=len(y) * np.finfo(np.float64).eps, abs=1e-15), name
    assert 0 < tally.auc_bound() < 1e-3  # the shared scores tie in both; the bound is small but not zero
    assert got["test_roc_auc"] != pytest.approx(0.5, abs=0.05)  # the scores carry the labels


def test_streamed_metrics_hold_the_rows_only_up_to_exact_rows():
    y, proba, classes = _scored(30_000, 3, seed=1)
    exact = StreamedMetrics("classification", classes, per_class=True, exact_rows=30_000)
    bounded = StreamedMetrics("classification", classes, per_class=True, exact_rows=10_000)
    for start in range(0, len(y), 4_000):
        exact.update(y[start:start + 4_000], proba[start:start + 4_000])
        bounded.update(y[start:start + 4_000], proba[start:start + 4_000])
    assert exact.tally is None and exact.result() == classification_metrics(y, proba, classes, per_class=True)
    assert bounded.tally is not None and bounded.labels == [] and bounded.probabilities == []
    assert bounded.tally.n == len(y)  # the rows held before the switch went into the tally too
    tally = ClassificationTally(classes)
    tally.update(y, proba)
    whole = tally.result(per_class=True)
    for name, value in bounded.result().items():  # the same counts; the log loss summed chunk by chunk
        assert value == pytest.approx(whole[name], rel=len(y) * np.finfo(np.float64).eps, abs=0), name


def test_the_tally_is_nan_where_scikit_learn_is_and_names_an_unknown_label():
    y, proba, classes = _scored(2_000, 3, seed=2)
    missing = y != classes[2]  # a class absent from the rows: no one-vs-rest curve for it
    tally = ClassificationTally(classes)
    tally.update(y[missing], proba[missing])
    assert np.isnan(tally.result()["test_roc_auc"])
    assert np.isnan(classification_metrics(y[missing], proba[missing], classes)["test_roc_auc"])
    bad = proba.copy()
    bad[3, 0] = np.nan
    tally = ClassificationTally(classes)
    tally.update(y, bad)
    assert all(np.isnan(v) for v in tally.result().values())
    with pytest.raises(ValueError, match=r"label 'c9' is not among the classes \['c0', 'c1', 'c2'\]"):
        ClassificationTally(classes).update(np.array(["c0", "c9"]), proba[:2])


def test_the_tally_auc_is_exact_when_each_bin_holds_one_score():
    """Scores on a grid of 1/256 (exact in float32, far coarser than a bin): each bin holds equal scores only, so
    the tally's ties are scikit-learn's ties and the AUC is exact (a tie counted other than half a pair fails)."""
    y, proba, classes = _scored(40_000, 2, seed=3)
    score = np.round(proba[:, 1].astype(np.float64) * 256) / 256
    proba = np.stack([1 - score, score], axis=1).astype(np.float32)
    tally = ClassificationTally(classes)
    tally.update(y, proba)
    expected = classification_metrics(y, proba, classes)["test_roc_auc"]
    assert tally.result()["test_roc_auc"] == pytest.approx(expected, rel=1e-12)
    assert tally.auc_bound() > 1e-3  # many ties: a wrong count of them would show
