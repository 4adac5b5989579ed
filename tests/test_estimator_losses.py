"""scikit-learn's losses in ortflow's loss family, and each estimator trained on its own objective by default.

Per-element values and derivatives are compared with scikit-learn's own loss functions on the float64 form of
ortflow's loss graphs (every float32 type of the graph made float64: the same nodes, without float32 rounding), and
the derivative with central finite differences of the same graph. The objective of each estimator is computed with
scikit-learn's functions (or its documented formula where it has none) at the graph's float32 weights.
"""

import importlib.util
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from sklearn._loss.loss import (
    HalfBinomialLoss,
    HalfGammaLoss,
    HalfPoissonLoss,
    HalfSquaredError,
    HalfTweedieLoss,
    HuberLoss,
    PinballLoss,
)
from sklearn.linear_model._huber import _huber_loss_and_gradient
from sklearn.linear_model._linear_loss import LinearModelLoss
from sklearn.linear_model._sgd_fast import (
    EpsilonInsensitive,
    Hinge,
    ModifiedHuber,
    SquaredEpsilonInsensitive,
    SquaredHinge,
)

from ortflow import OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer, add_loss_output, to_onnx
from ortflow.objectives.add_loss import LOSS_METADATA
from ortflow.convert.sklearn import estimator_record
from ortflow.objectives.estimator_loss import estimator_loss, learning_penalty
from ortflow.registry import select
from ortflow.runtime.sessions import OnnxFunction
from tolerances import U32, float32_sum_atol, matmul_atol

RNG = np.random.default_rng(0)


def _float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph with every float32 tensor, constant and cast made float64."""
    new = onnx.ModelProto()
    new.CopyFrom(model)
    for value in list(new.graph.input) + list(new.graph.output):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    for node in new.graph.node:
        for attr in node.attribute:
            if node.op_type == "Constant" and attr.name == "value" and attr.t.data_type == TensorProto.FLOAT:
                attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float64)))
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.DOUBLE
    return new


def _run64(model: onnx.ModelProto, pred, label) -> list[np.ndarray]:
    """Outputs of the float64 form of a loss graph on (prediction, label)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(_float64(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"prediction": np.asarray(pred, np.float64), "label": np.asarray(label, np.float64)})


def _sgd(cls, *args):
    loss = cls(*args)
    return (lambda y, p: np.array([loss.py_loss(a, b) for a, b in zip(p, y)]),
            lambda y, p: np.array([loss.py_dloss(a, b) for a, b in zip(p, y)]))


def _python_loss(loss, constant=False):
    def value(y, p):
        out = loss.loss(y_true=y, raw_prediction=p)
        return out + loss.constant_to_optimal_zero(y) if constant else out
    return value, lambda y, p: loss.gradient(y_true=y, raw_prediction=p)


def _scaled_huber(epsilon, sigma):
    def one(y, p):  # HuberRegressor's objective on one sample, no feature, the score as its intercept
        return _huber_loss_and_gradient(np.array([p, sigma]), np.zeros((1, 0)), np.array([y]), epsilon, 0.0,
                                        np.ones(1))
    return (lambda y, p: np.array([one(a, b)[0] for a, b in zip(y, p)]),
            lambda y, p: np.array([one(a, b)[1][-2] for a, b in zip(y, p)]))


def _log_cosh(scale):
    return (lambda y, p: scale**2 * np.log(np.cosh((p - y) / scale)), lambda y, p: scale * np.tanh((p - y) / scale))


# (registry name, settings, labels: 'real' | 'positive' | 'binary', scikit-learn's (value, derivative) of (y, p),
#  y as scikit-learn's function takes it)
CASES = [
    ("half_squared_error", {}, "real", _python_loss(HalfSquaredError())),
    ("log_cosh", {"scale": 0.7}, "real", _log_cosh(0.7)),  # not scikit-learn's: its numpy formula
    ("huber", {"epsilon": 0.7}, "real", _python_loss(HuberLoss(delta=0.7))),
    ("scaled_huber", {"epsilon": 1.35, "scale": 0.8}, "real", _scaled_huber(1.35, 0.8)),
    ("epsilon_insensitive", {"epsilon": 0.3}, "real", _sgd(EpsilonInsensitive, 0.3)),
    ("squared_epsilon_insensitive", {"epsilon": 0.3}, "real", _sgd(SquaredEpsilonInsensitive, 0.3)),
    ("hinge", {}, "binary", _sgd(Hinge, 1.0)),
    ("perceptron", {}, "binary", _sgd(Hinge, 0.0)),
    ("squared_hinge", {}, "binary", _sgd(SquaredHinge, 1.0)),
    ("modified_huber", {}, "binary", _sgd(ModifiedHuber)),
    ("log", {"eps": 0.0}, "binary01", _python_loss(HalfBinomialLoss())),
    ("quantile", {"quantile": 0.3}, "real", _python_loss(PinballLoss(quantile=0.3))),
    ("poisson", {}, "counts", _python_loss(HalfPoissonLoss(), constant=True)),
    ("gamma", {}, "positive", _python_loss(HalfGammaLoss(), constant=True)),
    ("tweedie", {"power": 1.5}, "counts", _python_loss(HalfTweedieLoss(power=1.5), constant=True)),
    ("tweedie", {"power": 3.0}, "positive", _python_loss(HalfTweedieLoss(power=3.0), constant=True)),
    ("tweedie", {"power": -0.5}, "positive", _python_loss(HalfTweedieLoss(power=-0.5), constant=True)),
]


def _labels(kind, n):
    if kind == "real":
        return RNG.normal(size=n) * 2
    if kind == "counts":
        return RNG.poisson(2.0, size=n).astype(np.float64)
    if kind == "positive":
        return RNG.gamma(2.0, size=n)
    return (RNG.uniform(size=n) > 0.5).astype(np.float64)


@pytest.mark.parametrize("name, settings, kind, reference", CASES, ids=[f"{c[0]}{c[1] or ''}" for c in CASES])
def test_loss_matches_scikit_learn_and_finite_differences(name, settings, kind, reference):
    loss = select("loss", name, **settings)
    n = 40
    pred = RNG.normal(size=n) * 1.5
    label = _labels(kind, n)
    sk_label = 2 * label - 1 if kind == "binary" else label  # SGD's classification losses take y in {-1, +1}
    value, derivative = reference
    mean, grad = _run64(loss.build_onnx_function(rank=1), pred, label)
    # 1e-6 relative (the issue's bound): the graph's constants (epsilon, quantile, 1 / (1 - p)) are float32, each
    # within 6e-8 relative of scikit-learn's float64 setting
    np.testing.assert_allclose(mean, value(sk_label, pred).mean(), rtol=1e-6)
    np.testing.assert_allclose(grad * n, derivative(sk_label, pred), rtol=1e-6, atol=1e-12)

    per_sample = loss.build_per_sample_function(rank=1)
    h = 1e-6
    up, down = (_run64(per_sample, pred + s * h, label)[0] for s in (1, -1))
    # central differences of a function smooth away from its kinks (random points lie at least h from them)
    np.testing.assert_allclose((up - down) / (2 * h), grad * n, rtol=1e-5, atol=1e-6)


def test_log_cosh_trains_in_both_trainers_and_its_scale_matters(regression_data):
    """A loss with a setting of its own trains in full and forward-backward training, the two taking the same steps
    (the same loss, written once); a smaller scale is a different loss, weighing large residuals less."""
    from sklearn.linear_model import LinearRegression

    X, y = regression_data
    X, y = X[:200].astype(np.float32), ((y[:200] - y[:200].mean()) / y[:200].std()).astype(np.float32)
    onx = to_onnx(LinearRegression().fit(X, -y))  # a start far from the weights
    common = dict(max_iter=10, batch_size=20, learning_rate=0.2, shuffle=False)
    finals = {}
    for scale in (1.0, 0.2):
        loss = select("loss", "log_cosh", scale=scale)
        full = OrtGradientOptimizer(add_loss_output(onx, score_name=loss), gradients="ortflow", **common).fit(X, y)
        fwbw = OrtGradientForwardBackwardOptimizer(onx, learning_loss=loss, gradients="ortflow", **common).fit(X, y)
        losses = [r["train_loss"] for r in full.history_]
        assert losses[-1] < 0.01 * losses[0]
        np.testing.assert_allclose(losses, [r["train_loss"] for r in fwbw.history_], rtol=1e-4)
        finals[scale] = losses[-1]
    assert finals[1.0] != finals[0.2]


def test_classification_losses_refuse_several_columns_and_bad_settings():
    with pytest.raises(ValueError, match="'hinge' scores two classes"):
        select("loss", "hinge").build_onnx_function(rank=2, width=3)
    with pytest.raises(ValueError, match="quantile=1.5"):
        select("loss", "quantile", quantile=1.5).build_onnx_function()
    with pytest.raises(ValueError, match="power=0.5"):
        select("loss", "tweedie", power=0.5).build_onnx_function()
    with pytest.raises(ValueError, match="epsilon=-1"):
        select("loss", "huber", epsilon=-1).build_onnx_function()


# --- each estimator on its own objective ----------------------------------------------------------------------
def _sgd_penalty(est, coef):
    kind = getattr(est, "penalty", None)
    ratio = {"l2": 0.0, "l1": 1.0, "elasticnet": est.l1_ratio}.get(kind)
    if ratio is None:
        return 0.0
    return est.alpha * ((1 - ratio) * 0.5 * (coef**2).sum() + ratio * np.abs(coef).sum())


def _sgd_loss(est):
    """SGD's per-sample loss as scikit-learn defines it (its own function objects)."""
    python = {"squared_error": HalfSquaredError(), "log_loss": HalfBinomialLoss(),
              "huber": HuberLoss(delta=getattr(est, "epsilon", 0.1))}
    if est.loss in python:
        return lambda y, p: python[est.loss].loss(y_true=y, raw_prediction=p)
    return _sgd(type(est._loss_function_), *est._loss_function_.__reduce__()[1])[0]


def _objective(est, X, y, coef, intercept):
    """scikit-learn's objective of ``est`` at (coef, intercept), per sample as ortflow's loss is (docs/LOSSES.md)."""
    name, n = type(est).__name__, len(X)
    raw = X @ coef + intercept
    if name == "Ridge":
        return (((y - raw) ** 2).sum() + est.alpha * (coef**2).sum()) / n
    if name in ("Lasso", "ElasticNet"):
        ratio = 1.0 if name == "Lasso" else est.l1_ratio
        return (((y - raw) ** 2).sum() / (2 * n) + est.alpha * ratio * np.abs(coef).sum()
                + 0.5 * est.alpha * (1 - ratio) * (coef**2).sum())
    if name in ("SGDRegressor", "SGDClassifier", "Perceptron"):
        target = y if name == "SGDRegressor" or est.loss == "log_loss" else 2 * y - 1
        return _sgd_loss(est)(target, raw).mean() + _sgd_penalty(est, coef)
    if name == "HuberRegressor":
        w = np.r_[coef, intercept, est.scale_]
        return _huber_loss_and_gradient(w, X, y, est.epsilon, est.alpha, np.ones(n))[0] / n
    if name in ("PoissonRegressor", "GammaRegressor", "TweedieRegressor"):
        base = est._get_loss()
        linear = LinearModelLoss(base_loss=base, fit_intercept=True)
        return linear.loss(np.r_[coef, intercept], X, y, l2_reg_strength=est.alpha) + \
            base.constant_to_optimal_zero(y).mean()
    if name == "QuantileRegressor":
        return PinballLoss(quantile=est.quantile).loss(y_true=y, raw_prediction=raw).mean() + \
            est.alpha * np.abs(coef).sum()
    if name in ("LinearSVC", "LinearSVR"):  # liblinear: r(w) + C sum(l), the intercept a weight of a constant feature
        if name == "LinearSVC":
            value = _sgd(Hinge if est.loss == "hinge" else SquaredHinge, 1.0)[0]
            losses = value(2 * y - 1, raw)
        else:
            cls = EpsilonInsensitive if est.loss == "epsilon_insensitive" else SquaredEpsilonInsensitive
            losses = _sgd(cls, est.epsilon)[0](y, raw)
        penalty = 0.5 * ((coef**2).sum() + (intercept / est.intercept_scaling) ** 2)
        return (penalty + est.C * losses.sum()) / (est.C * n)
    if name == "LogisticRegression":  # C * sum(l) + ||w||^2 / 2 (l1_ratio=0), lbfgs: the intercept unpenalized
        losses = HalfBinomialLoss().loss(y_true=y.astype(np.float64), raw_prediction=raw)
        return (est.C * losses.sum() + 0.5 * (coef**2).sum()) / (est.C * n)
    raise AssertionError(name)


def _estimators():
    from sklearn.linear_model import (
        ElasticNet,
        GammaRegressor,
        HuberRegressor,
        Lasso,
        Perceptron,
        PoissonRegressor,
        QuantileRegressor,
        Ridge,
        SGDClassifier,
        SGDRegressor,
        LogisticRegression,
        TweedieRegressor,
    )
    from sklearn.svm import LinearSVC, LinearSVR

    return {  # (estimator at a one-iteration start, data kind, learning rate)
        "ridge": (Ridge(alpha=3.0, solver="sag", max_iter=1), "real", 0.05),
        "lasso": (Lasso(alpha=0.05, max_iter=1), "real", 0.05),
        "elastic_net": (ElasticNet(alpha=0.05, l1_ratio=0.3, max_iter=1), "real", 0.05),
        "sgd_regressor": (SGDRegressor(loss="huber", epsilon=0.5, penalty="elasticnet", alpha=0.01), "real", 0.05),
        "sgd_classifier": (SGDClassifier(loss="modified_huber", alpha=0.01), "binary", 0.05),
        "sgd_classifier_hinge": (SGDClassifier(alpha=0.01, penalty="l1"), "binary", 0.05),
        "huber": (HuberRegressor(epsilon=1.5, alpha=0.1, max_iter=1), "real", 0.05),
        "poisson": (PoissonRegressor(alpha=0.1, max_iter=1), "counts", 0.05),
        "gamma": (GammaRegressor(alpha=0.1, max_iter=1), "positive", 0.05),
        "tweedie": (TweedieRegressor(power=1.5, link="log", alpha=0.1, max_iter=1), "counts", 0.05),
        "quantile": (QuantileRegressor(quantile=0.7, alpha=0.01), "real", 0.05),
        "perceptron": (Perceptron(penalty="l2", alpha=0.01, max_iter=1), "binary", 0.05),
        "linear_svc": (LinearSVC(C=0.5, max_iter=1), "binary", 0.05),
        "linear_svr": (LinearSVR(C=0.5, epsilon=0.2, max_iter=1), "real", 0.05),
        "logistic": (LogisticRegression(C=0.5, max_iter=1), "binary", 0.05),
    }


def _data(kind, n=60, n_features=3):
    X = RNG.normal(size=(n, n_features)).astype(np.float32)
    score = X.astype(np.float64) @ np.array([0.5, -0.3, 0.2]) + 0.1 * RNG.normal(size=n)
    if kind == "real":
        return X, score * 3 + 1
    if kind == "counts":
        return X, RNG.poisson(np.exp(score + 0.5)).astype(np.float64)
    if kind == "positive":
        return X, RNG.gamma(2.0, np.exp(score) / 2)
    return X, (score > 0).astype(np.int64)


def _start(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if hasattr(est, "partial_fit") and type(est).__name__ != "Perceptron":
            return est.partial_fit(X, y, classes=np.unique(y)) if hasattr(est, "classes_") or y.dtype.kind == "i" \
                else est.partial_fit(X, y)
        if type(est).__name__ == "QuantileRegressor":
            return est.fit(X[:8], y[:8])  # an LP solved at once: a start from a few rows
        return est.fit(X, y)


def _weights(graph):
    inits = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in graph.graph.initializer}
    return inits["coef"].ravel(), float(inits["intercept"].ravel()[0])


def _graph_loss(graph, X, y):
    function = OnnxFunction(graph, "cpu")
    names = [i.name for i in graph.graph.input]
    label = np.asarray(y, np.float32).reshape(-1, 1)
    return float(np.asarray(function.run(*[X if n == "X" else label for n in names])[0].numpy()))


@pytest.mark.parametrize("key", list(_estimators()))
def test_estimator_trains_on_its_own_objective(key):
    est, kind, rate = _estimators()[key]
    X, y = _data(kind)
    n = len(X)
    start = _start(est, X, y)
    graph = to_onnx(start)
    assert estimator_record(graph)["class"] == type(est).__name__
    full = add_loss_output(graph, n_samples=n)
    recorded = next(e for e in full.metadata_props if e.key == LOSS_METADATA)
    name, settings, penalty = estimator_loss(graph, n)
    assert f'"chosen_from": "{type(est).__name__}"' in recorded.value and f'"loss": "{name}"' in recorded.value

    # the graph's loss (float32) equals scikit-learn's objective at the graph's weights
    coef, intercept = _weights(graph)
    X64 = X.astype(np.float64)
    expected = _objective(start, X64, y, coef, intercept)
    value = _graph_loss(full, X, y)
    score = X64 @ coef + intercept
    score_atol = matmul_atol(X64, np.abs(coef).reshape(-1, 1)).ravel() + abs(intercept) * U32
    loss = select("loss", name, **settings)
    label = np.asarray(y, np.float64)
    slope = np.abs(_run64(loss.build_onnx_function(rank=1), score, label)[1]) * n
    per = np.abs(_run64(loss.build_per_sample_function(rank=1), score, label)[0])
    penalties = sum(c.get("l1", 0) * np.abs(coef).sum() + c.get("l2", 0) * (coef**2).sum()
                    for c in penalty.values())
    atol = (float32_sum_atol(per.sum() / n + penalties, n + 2 * len(coef)) + (slope * score_atol).mean()
            + 8 * U32 * (per.mean() + penalties))
    assert abs(value - expected) <= atol, (value, expected, atol)

    # full training from the start lowers the objective
    trained = OrtGradientOptimizer(full, max_iter=8, learning_rate=rate, batch_size=20, random_state=0).fit(X, y)
    assert trained.train_losses_[-1] < trained.train_losses_[0]
    coef_t, intercept_t = _weights(trained.get_trained_onnx())
    assert _objective(start, X64, y, coef_t, intercept_t) < expected

    # forward-backward training on the same loss and penalty
    fwbw = OrtGradientForwardBackwardOptimizer(graph, learning_loss=loss, learning_penalty=learning_penalty(penalty),
                                               max_iter=8, learning_rate=rate, batch_size=20, random_state=0).fit(X, y)
    assert fwbw.train_losses_[-1] < fwbw.train_losses_[0]
    coef_f, intercept_f = _weights(fwbw.get_trained_onnx())
    assert _objective(start, X64, y, coef_f, intercept_f) < expected

    # and in torch (trainer=torch), the same loss graph as an autograd function
    if importlib.util.find_spec("torch") is not None:
        from ortflow import TorchTrainer

        in_torch = TorchTrainer(graph, learning_loss=loss, learning_penalty=learning_penalty(penalty), max_iter=8,
                                learning_rate=rate, batch_size=20, random_state=0).fit(X, y)
        assert in_torch.train_losses_[-1] < in_torch.train_losses_[0]
        coef_t, intercept_t = _weights(in_torch.get_trained_onnx())
        assert _objective(start, X64, y, coef_t, intercept_t) < expected


def test_explicit_loss_wins_and_unknown_estimators_keep_squared_error(regression_data):
    from sklearn.linear_model import HuberRegressor, LinearRegression

    X, y = regression_data
    huber = to_onnx(HuberRegressor(max_iter=5).fit(X, y))
    assert '"loss": "scaled_huber"' in next(e.value for e in add_loss_output(huber, n_samples=len(X)).metadata_props
                                             if e.key == LOSS_METADATA)
    explicit = add_loss_output(huber, "absolute_error")
    assert '"loss": "absolute_error"' in next(e.value for e in explicit.metadata_props if e.key == LOSS_METADATA)
    plain = add_loss_output(to_onnx(LinearRegression().fit(X, y)))
    assert '"loss": "squared_error"' in next(e.value for e in plain.metadata_props if e.key == LOSS_METADATA)


def test_a_penalty_summed_over_samples_needs_n_samples(regression_data):
    from sklearn.linear_model import Ridge

    X, y = regression_data
    graph = to_onnx(Ridge(alpha=2.0).fit(X, y))
    with pytest.warns(UserWarning, match="Ridge's objective sums its losses.*n_samples"):
        assert estimator_loss(graph) == ("squared_error", {}, {})
    assert estimator_loss(graph, n_samples=len(X)) == ("squared_error", {}, {"coef": {"l2": 2.0 / len(X)}})
    with pytest.raises(ValueError, match="n_samples=0"):
        estimator_loss(graph, n_samples=0)


def test_sgd_classifier_with_a_regression_loss_names_it(classification_data):
    from sklearn.linear_model import SGDClassifier

    X, y = classification_data
    yb = (y == y[0]).astype(int)
    graph = to_onnx(SGDClassifier(loss="epsilon_insensitive", max_iter=2).fit(X, yb))
    with pytest.raises(ValueError, match="SGDClassifier\\(loss='epsilon_insensitive'\\)"):
        add_loss_output(graph)


@pytest.mark.training_build
@pytest.mark.parametrize("key", ["sgd_classifier_hinge", "perceptron", "huber", "poisson", "tweedie", "quantile"])
def test_onnxruntime_and_ortflow_gradients_of_the_new_losses_agree(key):
    """Full training differentiates the loss's value nodes: onnxruntime's gradient builder and ortflow's own take
    the same steps (the same weights after an epoch, to float32 rounding of the updates)."""
    est, kind, rate = _estimators()[key]
    X, y = _data(kind)
    graph = add_loss_output(to_onnx(_start(est, X, y)), n_samples=len(X))
    common = dict(max_iter=2, learning_rate=rate, batch_size=20, random_state=0)
    ours = OrtGradientOptimizer(graph, gradients="ortflow", **common).fit(X, y)
    theirs = OrtGradientOptimizer(graph, gradients="onnxruntime", **common).fit(X, y)
    for name, value in ours.get_state().items():
        start = numpy_helper.to_array(next(i for i in graph.graph.initializer if i.name == name))
        # each update moves a weight by at most rate * |gradient|; two float32 runs differ by roundings of it
        step = np.abs(value - start).max() + np.abs(start).max()
        np.testing.assert_allclose(theirs.get_state()[name], value, rtol=0, atol=64 * U32 * step)


def test_objectives_written_from_scikit_learns_formulas_are_what_it_minimizes():
    """Where scikit-learn has no function for its objective (Ridge, liblinear's LinearSVC/LinearSVR, the lbfgs
    LogisticRegression), the formula the tests compare ortflow's loss with is stationary at scikit-learn's converged
    fit: the penalty's scale (alpha / n, 1 / (2 C n)) and liblinear's penalized intercept (intercept_scaling) are
    those scikit-learn minimizes."""
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.svm import LinearSVC, LinearSVR

    for est, kind in [(Ridge(alpha=3.0), "real"), (LinearSVC(C=0.5, tol=1e-12, max_iter=100000), "binary"),
                      (LinearSVC(C=0.5, tol=1e-12, max_iter=100000, intercept_scaling=3.0), "binary"),
                      (LinearSVR(C=0.5, epsilon=0.2, loss="squared_epsilon_insensitive", tol=1e-12, max_iter=100000),
                       "real"),
                      (LogisticRegression(C=0.5, tol=1e-12, max_iter=10000), "binary")]:
        X, y = _data(kind)
        X = X.astype(np.float64)
        est.fit(X, y)
        w = np.r_[np.ravel(est.coef_), np.ravel(est.intercept_)]
        h = 1e-5
        grad = [(_objective(est, X, y, (w + h * e)[:-1], (w + h * e)[-1])
                 - _objective(est, X, y, (w - h * e)[:-1], (w - h * e)[-1])) / (2 * h) for e in np.eye(len(w))]
        # a wrong scale or an unpenalized intercept leaves a gradient of the penalty's size (about 1e-2 here); the
        # solvers stop within 1e-8 of the optimum, central differences err by h ** 2 times the third derivative
        np.testing.assert_allclose(grad, 0.0, atol=1e-6, err_msg=repr(est))
