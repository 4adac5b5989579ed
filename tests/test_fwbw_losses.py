"""fwbw learning losses and penalties against numpy, and the family registry."""

import numpy as np
import pytest

from ortflow import (AbsoluteLearningLoss, BaseLearningLoss, ElasticLearningLoss, ElasticLearningPenalty,
                     LearningRateSGD, NegLogLearningLoss, NoLearningPenalty, SquareLearningLoss)
from ortflow.registry import select
from ortflow.runtime.sessions import OnnxFunction
from tolerances import assert_close, float32_sum_atol

RNG = np.random.default_rng(0)
PRED = RNG.normal(size=(7, 2)).astype(np.float32)
LABEL = RNG.normal(size=(7, 2)).astype(np.float32)
WEIGHT = RNG.uniform(0.1, 2.0, size=7).astype(np.float32)


def _reference(loss, pred, label, weight):
    """(mean of w * l summed over columns, derivative of that mean) in float64."""
    p, y = pred.astype(np.float64), label.astype(np.float64)
    w = np.ones(len(p)) if weight is None else weight.astype(np.float64)
    d = p - y
    if isinstance(loss, SquareLearningLoss):
        elem, der = d**2, 2 * d
    elif isinstance(loss, AbsoluteLearningLoss):
        elem, der = np.abs(d), np.sign(d)
    elif isinstance(loss, ElasticLearningLoss):
        elem = loss.l1_weight * np.abs(d) + loss.l2_weight * d**2
        der = loss.l1_weight * np.sign(d) + 2 * loss.l2_weight * d
    else:
        elem = np.logaddexp(0, p) - y * p
        der = 1 / (1 + np.exp(-p)) - y
    per = elem.reshape(len(p), -1).sum(axis=1)
    wb = w.reshape((-1,) + (1,) * (p.ndim - 1))
    return (w * per).mean(), der * wb / len(p)


@pytest.mark.parametrize("loss", [SquareLearningLoss(), AbsoluteLearningLoss(), ElasticLearningLoss(0.3, 0.7)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("rank", [1, 2])
def test_regression_losses_match_numpy(loss, weighted, rank):
    pred, label = (PRED, LABEL) if rank == 2 else (PRED[:, 0], LABEL[:, 0])
    weight = WEIGHT if weighted else None
    value, grad = loss.loss_gradient("cpu", label, pred, weight)
    ref_value, ref_grad = _reference(loss, pred, label, weight)
    np.testing.assert_allclose(value.numpy(), ref_value, rtol=1e-5)
    assert grad.numpy().shape == pred.shape
    # each element derives from p - y, whose float32 rounding is set by |p| + |y|, not by the difference
    weights = 1.0 if weight is None else np.abs(weight).reshape((-1,) + (1,) * (pred.ndim - 1))
    scale = (np.abs(pred) + np.abs(label)) * weights
    assert_close(grad.numpy(), ref_grad, atol=float32_sum_atol(2 * scale / len(pred), 2))


def test_neg_log_loss_matches_numpy_and_ortflow_add_loss_output():
    score = (RNG.normal(size=(9, 1)) * 4).astype(np.float32)
    score[0, 0], score[1, 0] = 60.0, -60.0  # saturated: no overflow, no log(0)
    label = (RNG.uniform(size=(9, 1)) > 0.5).astype(np.float32)
    label[0, 0], label[1, 0] = 0.0, 1.0
    loss = NegLogLearningLoss(eps=0.0)
    value, grad = loss.loss_gradient("cpu", label, score)
    ref_value, ref_grad = _reference(loss, score, label, None)
    np.testing.assert_allclose(value.numpy(), ref_value, rtol=1e-5)
    np.testing.assert_allclose(grad.numpy(), ref_grad, rtol=1e-5, atol=1e-8)
    assert np.isfinite(value.numpy())

    # the same value as the 'log' score of add_loss_output on a graph that outputs its input
    import onnx
    from onnx import helper

    from ortflow import add_loss_output

    ident = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["X"], ["raw_score"])], "g",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [None, 1])],
        [helper.make_tensor_value_info("raw_score", onnx.TensorProto.FLOAT, [None, 1])]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    full = OnnxFunction(add_loss_output(ident, "log"))
    np.testing.assert_allclose(full.run(score, label)[0].numpy(), value.numpy(), rtol=1e-6)


def test_neg_log_eps_clips_the_probability_of_the_gradient():
    score = np.array([[-30.0], [0.0], [30.0]], dtype=np.float32)
    label = np.array([[0.0], [1.0], [1.0]], dtype=np.float32)
    _, grad = NegLogLearningLoss(eps=1e-3).loss_gradient("cpu", label, score)
    np.testing.assert_allclose(grad.numpy().ravel() * 3, [1e-3, -0.5, -1e-3], rtol=1e-4)


def test_scaled_weight_graph_equals_the_plain_one():
    loss = ElasticLearningLoss(0.2, 0.9)
    plain = OnnxFunction(loss.build_onnx_function(weight_name="w", rank=2))
    scaled = OnnxFunction(loss.build_onnx_function(weight_name="w", rank=2, scaled_weight=True))
    a = [v.numpy() for v in plain.run(PRED, LABEL, WEIGHT)]
    b = [v.numpy() for v in scaled.run(PRED, LABEL, (WEIGHT / len(WEIGHT))[:, None])]
    np.testing.assert_allclose(a[0], b[0], rtol=1e-6)
    np.testing.assert_allclose(a[1], b[1], rtol=1e-6)


def test_elastic_penalty_value_and_gradient_match_numpy():
    weights = [RNG.normal(size=(4, 3)).astype(np.float32), RNG.normal(size=5).astype(np.float32)]
    penalty = ElasticLearningPenalty(l1=0.3, l2=0.2)
    expected = sum(0.3 * np.abs(w).sum() + 0.2 * (w.astype(np.float64) ** 2).sum() for w in weights)
    np.testing.assert_allclose(penalty.penalty_loss("cpu", *weights), expected, rtol=1e-5)
    grad = RNG.normal(size=(4, 3)).astype(np.float32)
    new = penalty.penalty_gradient("cpu", grad, weights[0]).numpy()
    terms = (grad, 0.3 * np.sign(weights[0]), 0.4 * weights[0].astype(np.float64))  # a sum that may cancel
    assert_close(new, sum(terms), atol=float32_sum_atol(sum(np.abs(t) for t in terms), len(terms)))
    assert NoLearningPenalty().penalty_loss("cpu", *weights) == 0.0
    np.testing.assert_array_equal(NoLearningPenalty().penalty_gradient("cpu", grad, weights[0]).numpy(), grad)


def test_select_by_name_instance_and_user_subclass():
    assert isinstance(select("loss", "square_error"), SquareLearningLoss)
    assert isinstance(select("loss", "neg_log"), NegLogLearningLoss)
    assert isinstance(select("penalty", None), NoLearningPenalty)
    assert isinstance(select("penalty", "l1l2", l1=0.1), ElasticLearningPenalty)
    assert select("penalty", "elastic").l1 == 0.5
    rate = LearningRateSGD(eta0=0.3)
    assert select("learning_rate", rate) is rate

    class CubeLoss(BaseLearningLoss):
        names = ("cube_error",)

        def __init__(self):
            pass

        def _per_sample(self, b, pred, label):
            d = b.node("Abs", [b.node("Sub", [pred, label])])
            return b.node("Mul", [b.node("Mul", [d, d]), d])

        def _derivative(self, b, pred, label):
            d = b.node("Sub", [pred, label])
            return b.node("Mul", [b.node("Mul", [d, b.node("Abs", [d])]), b.const(3.0)])

    cube = select("loss", "cube_error")
    value, _ = cube.loss_gradient("cpu", LABEL, PRED)
    np.testing.assert_allclose(value.numpy(), (np.abs(PRED - LABEL) ** 3).sum(axis=1).mean(), rtol=1e-5)

    with pytest.raises(ValueError, match="is unknown"):
        select("loss", "nope")
    with pytest.raises(TypeError, match="registered name or an instance"):
        select("loss", LearningRateSGD())
    with pytest.raises(ValueError, match="not a family"):
        select("scheduler", "SGD")


def test_select_refuses_a_setting_the_class_does_not_take():
    """Seen: every optimizer was handed momentum, weight_decay and power_t, the ones it did not take dropped."""
    assert select("learning_rate", "adamw", weight_decay=0.5).weight_decay == 0.5
    with pytest.raises(ValueError, match=r"trainer.optimizer='sgd' \(LearningRateSGD\) takes no weight_decay"):
        select("learning_rate", "sgd", "trainer.optimizer", weight_decay=0.5)
    with pytest.raises(ValueError, match=r"loss='square' \(SquareLearningLoss\) takes no l1_weight, l2_weight"):
        select("loss", "square", l1_weight=0.5, l2_weight=0.5)
    with pytest.raises(ValueError, match="is an instance: settings"):
        select("learning_rate", LearningRateSGD(), eta0=0.1)


@pytest.mark.filterwarnings("ignore:LogisticRegression's objective sums its losses:UserWarning")
def test_forward_backward_with_no_loss_named_trains_the_estimator_s_own_loss():
    """Seen (issue 46, item 2): ``OrtGradientForwardBackwardOptimizer(to_onnx(classifier))`` with no loss named
    trained squared error on the raw scores (penguins: test log loss 0.60 against 0.089 with the log loss). With no
    loss named it trains the estimator's own loss, the one ``add_loss_output`` gives the full trainer
    (``ortflow.objectives.estimator_loss``: log loss for a LogisticRegression), so both trainers end where the same run of the
    same objective ends; squared error on the same graph ends far above."""
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss

    from ortflow import OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer, add_loss_output, to_onnx
    from sklearn_fit import quiet_fit

    X, y = load_iris(return_X_y=True)
    X = ((X - X.mean(axis=0)) / X.std(axis=0)).astype(np.float32)
    onx = to_onnx(quiet_fit(LogisticRegression(max_iter=1), X, y), X[:1])  # a start far from the optimum
    common = dict(max_iter=40, batch_size=15, learning_rate=0.1, random_state=0, shuffle=True)
    full = OrtGradientOptimizer(add_loss_output(onx), **common).fit(X, y)
    own = OrtGradientForwardBackwardOptimizer(onx, **common).fit(X, y)
    square = OrtGradientForwardBackwardOptimizer(onx, learning_loss="squared_error", **common).fit(X, y)
    assert own._loss_object().names[0] == "log"
    ll = {name: log_loss(y, est.predict_proba(X)) for name, est in
          (("full", full), ("own", own), ("square", square))}
    # Both trainers take the same batches (one seed) and the same steps of one objective, computed by different
    # float32 graphs: each step's gradient differs by a few roundings (|g| * k * eps32, k ~ the ops of a softmax
    # and a mean, well under 100), and gradient steps on a convex loss at a stable rate do not amplify a difference.
    # Over S steps the weights drift by at most S * lr * 100 * eps32 * |g| (|g| <= 1 for a softmax loss on standard
    # features), which moves the log loss by about as much times |X| ~ 4.
    steps = common["max_iter"] * len(X) // common["batch_size"]
    bound = steps * common["learning_rate"] * 100 * np.finfo(np.float32).eps * 4
    assert abs(ll["own"] - ll["full"]) <= bound, (ll, bound)
    assert ll["own"] < ll["square"] / 2, ll  # squared error on raw scores is no calibrated probability
