"""Each scikit-learn estimator's own loss and penalty, as ortflow's loss family and penalties express them.

ortflow's loss is a mean, ``sum(w * l) / N``, plus ``l1 * sum|W| + l2 * sum(W ** 2)`` per penalized weight. An
estimator whose objective is a mean already (SGD*, Perceptron, Lasso, ElasticNet, QuantileRegressor, the GLMs) maps
onto it exactly: the total equals scikit-learn's objective at the same weights. An estimator whose objective sums
its losses (Ridge, HuberRegressor, LinearSVC, LinearSVR, LogisticRegression) maps onto its objective divided by
``n_samples`` (by ``C * n_samples`` for the C-parametrized ones): the same minimizer, and a penalty that depends on
the number of training samples, so its penalty needs ``n_samples``. docs/LOSSES.md has the table.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from ..convert.sklearn import estimator_record
from ..graph.editing import ModelLike
from .penalties import BaseLearningPenalty, ElasticLearningPenalty, NoLearningPenalty

if TYPE_CHECKING:
    from .losses import BaseLearningLoss

#: the loss of a graph whose estimator is unknown (not converted by ortflow.to_onnx, or an estimator not listed), by
#: task: the one default-loss table. The core's trainers and add_loss_output cannot tell a graph's task without a
#: record and take regression's (onnxcustom's default); the pipelines take the data's task's
DEFAULT_LOSS = {"regression": "squared_error", "classification": "log"}
_SGD_LOSSES = {"squared_error": "half_squared_error", "huber": "huber", "epsilon_insensitive": "epsilon_insensitive",
               "squared_epsilon_insensitive": "squared_epsilon_insensitive", "hinge": "hinge",
               "log_loss": "log", "modified_huber": "modified_huber", "squared_hinge": "squared_hinge",
               "perceptron": "perceptron"}
_CLASSIFICATION_SGD_LOSSES = ("hinge", "log_loss", "modified_huber", "squared_hinge", "perceptron")
_EPSILON_LOSSES = ("huber", "epsilon_insensitive", "squared_epsilon_insensitive")


def estimator_loss(model: ModelLike | dict, n_samples: int | None = None) -> tuple[str, dict, dict]:
    """``(loss name, loss settings, penalty)`` of the estimator a graph of :func:`ortflow.to_onnx` comes from (or
    of a record as :func:`ortflow.convert.sklearn.estimator_record` returns it); the penalty maps initializer names to
    ``{'l1': a, 'l2': b}`` as :func:`ortflow.add_loss_output` takes it. ``n_samples`` (the number of training
    samples) is needed by the penalties of estimators whose objective sums the losses; without it they are left
    out, with a warning."""
    record = model if isinstance(model, dict) else estimator_record(model)
    name, params = record.get("class"), dict(record.get("params", {}))
    params.update(record.get("fitted", {}))
    rule = _RULES.get(name)
    if rule is None:
        return DEFAULT_LOSS["regression"], {}, {}
    loss, settings, penalty, per_sample = rule(params)
    if per_sample:  # the penalty of an objective summed over the samples, on the mean loss
        if n_samples is None:
            if any(v for c in penalty.values() for v in c.values()):
                warnings.warn(f"{name}'s objective sums its losses, so its penalty on ortflow's mean loss divides "
                              "by the number of training samples, not given: the graph trains without a penalty "
                              "(add_loss_output(..., n_samples=len(X_train)) adds it; forward-backward training: "
                              "learning_penalty=learning_penalty(estimator_loss(graph, len(X_train))[2]))",
                              UserWarning, stacklevel=3)
            penalty = {}
        else:
            if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
                raise ValueError(f"n_samples={n_samples!r} must be a positive int (the number of training samples)")
            penalty = {w: {k: v / n_samples for k, v in c.items()} for w, c in penalty.items()}
    return loss, settings, {w: {k: v for k, v in c.items() if v} for w, c in penalty.items() if any(c.values())}


def own_loss(model: ModelLike, loss: Any = None) -> BaseLearningLoss:
    """The loss a trainer that adds the loss itself trains (a fresh object): ``loss`` (its ``learning_loss``: a
    registered name or an instance, cloned), or, when it is None, the model's own loss as
    :func:`ortflow.add_loss_output` picks it for the full trainer (:func:`estimator_loss`: the estimator's loss with
    its settings, ``squared_error`` for a graph without a record)."""
    from sklearn.base import clone

    from ..registry import select

    if loss is not None:
        return clone(select("loss", loss))
    name, settings, _ = _quietly(model)
    return select("loss", name, "learning_loss", **settings)


def own_penalty(model: ModelLike, loss: Any = None, penalty: Any = None) -> BaseLearningPenalty:
    """The penalty that goes with :func:`own_loss`, as :func:`ortflow.add_loss_output` adds it: ``penalty`` (the
    trainer's ``learning_penalty``) when given (a name or an instance, cloned); None with the model's own loss
    (``loss`` None): the estimator's penalty (:func:`estimator_loss` without ``n_samples``, so that of an objective
    summing its losses is left out with a warning); None with a named loss: no penalty."""
    from sklearn.base import clone

    from ..registry import select

    if penalty is not None or loss is not None:
        return clone(select("penalty", penalty))
    return learning_penalty(estimator_loss(model)[2])


def _quietly(model: ModelLike) -> tuple[str, dict, dict]:
    """:func:`estimator_loss` without the warning about a penalty needing ``n_samples`` (the loss alone is asked)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return estimator_loss(model)


def learning_penalty(penalty: dict) -> BaseLearningPenalty:
    """The penalty object of forward-backward training for a penalty of :func:`estimator_loss`: one
    :class:`ElasticLearningPenalty` on the named weights, which must share their coefficients."""
    if not penalty:
        return NoLearningPenalty()
    coefficients = {(c.get("l1", 0.0), c.get("l2", 0.0)) for c in penalty.values()}
    if len(coefficients) > 1:
        raise ValueError(f"penalty {penalty} weighs its weights differently; forward-backward training takes one "
                         "penalty for all: train with OrtGradientOptimizer and add_loss_output")
    (l1, l2), = coefficients
    return ElasticLearningPenalty(l1=l1, l2=l2, weights=sorted(penalty))


def _missing(name: str, params: dict, *keys: str) -> None:
    absent = [k for k in keys if k not in params]
    if absent:
        raise ValueError(f"the graph's estimator record ({name}) lacks {absent}: convert the model with "
                         "ortflow.to_onnx or pass score_name")


# Each rule: settings -> (loss, loss settings, {weight: {'l1': a, 'l2': b}}, whether the penalty is per sample).
def _plain(loss: str):
    return lambda p: (loss, {}, {}, False)


def _ridge(p):
    _missing("Ridge", p, "alpha")
    return "squared_error", {}, {"coef": {"l2": float(p["alpha"])}}, True


def _elastic_net(p):
    _missing("ElasticNet", p, "alpha")
    alpha, ratio = float(p["alpha"]), float(p.get("l1_ratio", 1.0))
    return "half_squared_error", {}, {"coef": {"l1": alpha * ratio, "l2": alpha * (1 - ratio) / 2}}, False


def _sgd_penalty(p) -> dict:
    """SGD's ``alpha * R(w)``: l2 ``||w||^2 / 2``, l1 ``||w||_1``, elasticnet ``(1 - r) ||w||^2 / 2 + r ||w||_1``."""
    kind, alpha = p.get("penalty"), float(p.get("alpha", 0.0))
    ratio = {"l2": 0.0, "l1": 1.0, "elasticnet": float(p.get("l1_ratio", 0.15))}.get(kind)
    if ratio is None:
        return {}
    return {"coef": {"l1": alpha * ratio, "l2": alpha * (1 - ratio) / 2}}


def _sgd(classifier: bool):
    def rule(p):
        name = "SGDClassifier" if classifier else "SGDRegressor"
        _missing(name, p, "loss")
        loss = p["loss"]
        if loss not in _SGD_LOSSES or (classifier and loss not in _CLASSIFICATION_SGD_LOSSES):
            raise ValueError(f"{name}(loss={loss!r}) has no loss in ortflow: pass score_name")
        settings = {"epsilon": float(p.get("epsilon", 0.1))} if loss in _EPSILON_LOSSES else {}
        return _SGD_LOSSES[loss], settings, _sgd_penalty(p), False
    return rule


def _perceptron(p):
    return "perceptron", {}, _sgd_penalty(p), False


def _huber(p):
    _missing("HuberRegressor", p, "epsilon", "alpha", "scale_")
    return ("scaled_huber", {"epsilon": float(p["epsilon"]), "scale": float(p["scale_"])},
            {"coef": {"l2": float(p["alpha"])}}, True)


def _glm(loss: str, **settings):
    def rule(p):
        return loss, settings, {"coef": {"l2": float(p.get("alpha", 1.0)) / 2}}, False
    return rule


def _tweedie(p):
    power, link = float(p.get("power", 0.0)), p.get("link", "auto")
    if link == "identity" or (link == "auto" and power <= 0):
        raise ValueError(f"TweedieRegressor(power={power}, link={link!r}) has an identity link; ortflow's Tweedie loss "
                         "has a log link: fit it with link='log' or pass score_name")
    return _glm("tweedie", power=power)(p)


def _quantile(p):
    return "quantile", {"quantile": float(p.get("quantile", 0.5))}, {"coef": {"l1": float(p.get("alpha", 1.0))}}, False


def _liblinear_penalty(p, l1_ratio: float, intercept: bool) -> dict:
    """``r(w) / C`` of liblinear's ``r(w) + C * sum(l)``, with ``r = (1 - ratio) ||w||^2 / 2 + ratio ||w||_1``; the
    intercept ``b`` is penalized as the weight ``b / intercept_scaling`` of a constant feature."""
    c = float(p.get("C", 1.0))
    if c == float("inf"):
        return {}
    l1, l2 = l1_ratio / c, (1 - l1_ratio) / (2 * c)
    penalty = {"coef": {"l1": l1, "l2": l2}}
    if intercept and p.get("fit_intercept", True):
        s = float(p.get("intercept_scaling", 1.0))
        penalty["intercept"] = {"l1": l1 / s, "l2": l2 / s**2}
    return penalty


def _linear_svc(p):
    loss = p.get("loss", "squared_hinge")
    return loss, {}, _liblinear_penalty(p, 1.0 if p.get("penalty", "l2") == "l1" else 0.0, True), True


def _linear_svr(p):
    loss = p.get("loss", "epsilon_insensitive")
    return loss, {"epsilon": float(p.get("epsilon", 0.0))}, _liblinear_penalty(p, 0.0, True), True


def _logistic(p):
    kind = p.get("penalty", "deprecated")
    if kind is None:
        return "log", {}, {}, False
    ratio = {"l2": 0.0, "l1": 1.0}.get(kind)
    if ratio is None:  # 'elasticnet', or scikit-learn >= 1.8's l1_ratio alone
        ratio = float(p.get("l1_ratio") or 0.0)
    return "log", {}, _liblinear_penalty(p, ratio, p.get("solver") == "liblinear"), True


_RULES: dict[str, Any] = {
    "LinearRegression": _plain("squared_error"),
    "MLPRegressor": _plain("squared_error"),
    "MLPClassifier": _plain("log"),
    "Ridge": _ridge,
    "Lasso": lambda p: _elastic_net({**p, "l1_ratio": 1.0}),
    "ElasticNet": _elastic_net,
    "SGDRegressor": _sgd(False),
    "SGDClassifier": _sgd(True),
    "Perceptron": _perceptron,
    "HuberRegressor": _huber,
    "PoissonRegressor": _glm("poisson"),
    "GammaRegressor": _glm("gamma"),
    "TweedieRegressor": _tweedie,
    "QuantileRegressor": _quantile,
    "LinearSVC": _linear_svc,
    "LinearSVR": _linear_svr,
    "LogisticRegression": _logistic,
}
#: the estimators whose own loss add_loss_output picks (others get regression's DEFAULT_LOSS)
ESTIMATORS = tuple(_RULES)
