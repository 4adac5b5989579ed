"""add_loss_output: every variant against numpy."""

import numpy as np
import onnxruntime as ort
import pytest

from ortflow import add_loss_output, to_onnx
from ortflow._ort import max_ir_version
from ortflow.exceptions import UnsupportedModelError


def _run(model, **feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.fixture(scope="module")
def linear(regression_data):
    from sklearn.linear_model import LinearRegression

    X, y = regression_data
    return to_onnx(LinearRegression().fit(X, y)), X, y


@pytest.mark.parametrize(
    "score, per_sample",
    [
        ("squared_error", lambda d: d**2),
        ("l2", lambda d: d**2),
        ("absolute_error", np.abs),
        ("l1", np.abs),
        ("elastic", lambda d: 0.3 * np.abs(d) + 0.7 * d**2),
    ],
)
def test_regression_losses_match_numpy(linear, score, per_sample):
    onx, X, y = linear
    rng = np.random.default_rng(0)
    label = (y + rng.normal(size=y.shape)).astype(np.float32).reshape(-1, 1)
    model = add_loss_output(onx, score, l1_weight=0.3, l2_weight=0.7)
    loss, pred = _run(model, X=X, label=label)
    expected = per_sample(pred - label).sum(axis=1).mean()
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert [o.name for o in model.graph.output] == ["loss", "variable"]


def test_elastic_with_sample_weight_and_penalty_matches_numpy(linear):
    onx, X, y = linear
    rng = np.random.default_rng(1)
    label = (y + rng.normal(size=y.shape)).astype(np.float32).reshape(-1, 1)
    weight = rng.uniform(0.1, 2.0, size=len(X)).astype(np.float32)
    penalty = {"coef": {"l1": 0.01, "l2": 0.02}, "intercept": 0.5}
    model = add_loss_output(onx, "elastic", weight_name="weight", penalty=penalty, l1_weight=0.4, l2_weight=0.6)
    loss, pred = _run(model, X=X, label=label, weight=weight)
    inits = {i.name: np.frombuffer(i.raw_data, dtype=np.float32) for i in onx.graph.initializer}
    d = (pred - label).ravel()
    expected = np.mean(weight * (0.4 * np.abs(d) + 0.6 * d**2))
    expected += 0.01 * np.abs(inits["coef"]).sum() + 0.02 * (inits["coef"] ** 2).sum()
    expected += 0.5 * (inits["intercept"] ** 2).sum()
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_log_loss_matches_numpy_and_is_stable(classification_data):
    from sklearn.linear_model import LogisticRegression

    X, y = classification_data
    onx = to_onnx(LogisticRegression().fit(X, y))
    model = add_loss_output(onx, "log")  # picks 'raw_score' among three outputs
    label = y.astype(np.float32).reshape(-1, 1)
    loss, _, proba, raw = _run(model, X=X, label=label)
    p = proba[:, 1:2].astype(np.float64)
    expected = -np.mean(label * np.log(p) + (1 - label) * np.log(1 - p))
    np.testing.assert_allclose(loss, expected, rtol=1e-4)
    # huge scores must not overflow
    big = add_loss_output(onx, "log")
    loss_big = _run(big, X=X * 1e4, label=label)[0]
    assert np.isfinite(loss_big)


def test_output_picked_by_index_and_name(classification_data):
    from sklearn.linear_model import LogisticRegression

    X, y = classification_data
    onx = to_onnx(LogisticRegression().fit(X, y))
    by_name = add_loss_output(onx, "log", output_index="raw_score")
    by_index = add_loss_output(onx, "log", output_index=2)
    label = y.astype(np.float32).reshape(-1, 1)
    assert _run(by_name, X=X, label=label)[0] == pytest.approx(_run(by_index, X=X, label=label)[0])
    with pytest.raises(ValueError, match="out of range"):
        add_loss_output(onx, "log", output_index=5)
    with pytest.raises(ValueError, match="holds probabilities"):
        add_loss_output(onx, "log", output_index="output_probability")


def test_bad_arguments_are_named(linear):
    onx, _, _ = linear
    with pytest.raises(ValueError, match="score_name='hinge'"):
        add_loss_output(onx, "hinge")
    with pytest.raises(ValueError, match="label_name='X' collides"):
        add_loss_output(onx, label_name="X")
    with pytest.raises(ValueError, match="loss_name='coef' collides"):
        add_loss_output(onx, loss_name="coef")
    with pytest.raises(ValueError, match="'nope'"):
        add_loss_output(onx, penalty={"nope": 1.0})


def test_ir_and_opset_too_new_are_rejected_with_advice(linear):
    onx, _, _ = linear
    newer = type(onx)()
    newer.CopyFrom(onx)
    limit = max_ir_version()  # 10 on the training build, read from the plain onnxruntime otherwise
    newer.ir_version = limit + 1
    with pytest.raises(UnsupportedModelError, match=f"IR version {limit + 1}.*at most {limit}"):
        add_loss_output(newer)
    newer.ir_version = 8
    newer.opset_import[0].version = 22
    with pytest.raises(UnsupportedModelError, match="opset 22.*target_opset=21"):
        add_loss_output(newer)
