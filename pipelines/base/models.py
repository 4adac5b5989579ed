"""The table of models: each ``model=`` option once, with its scikit-learn class, its task, the settings of
``cfg.model`` its class takes and its link function.

From it come ``model.name``'s choices and each model's task (:mod:`pipelines.base.schema`), the estimators
``convert`` fits (:func:`pipelines.modeling.estimators.build_estimator`) and the models whose graph outputs the
linear predictor of a log link. A model's loss is not here: it is its estimator's own
(:func:`ortflow.objectives.estimator_loss.estimator_loss`). A new model is one line of :data:`MODELS` and its
``conf/model/<name>.yaml``.

This module imports nothing heavy (the config schema reads it before anything is composed): the classes are
named, and imported when an estimator is built. It belongs to the base layer, as the stage table does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

#: a setting of ``cfg.model`` -> the estimator parameter it sets, where the names differ (``seed`` is the config's
#: top-level seed)
RENAMED = {"start_max_iter": "max_iter", "sgd_loss": "loss", "seed": "random_state"}


@dataclass(frozen=True)
class Model:
    """One ``model=`` option. ``estimator``: the scikit-learn class as ``module.Class`` (None: the user's graph,
    ``model=onnx``); ``task``: ``'regression'`` or ``'classification'`` (None: the data's); ``settings``: the keys
    of ``cfg.model`` (and ``seed``) passed to the class, under the parameter names of :data:`RENAMED`, a None value
    left out (the class's own default); ``defaults``: the parameters given when their setting is None, and those
    fixed; ``log_link``: the graph outputs the linear predictor, the mean is its exponential."""

    name: str
    estimator: Optional[str]
    task: Optional[str]
    settings: tuple[str, ...] = ()
    defaults: dict[str, Any] = field(default_factory=dict)
    log_link: bool = False

    @property
    def class_name(self) -> Optional[str]:
        return self.estimator.rpartition(".")[2] if self.estimator else None


_LINEAR = ("alpha", "fit_intercept")
_ITERATIVE = (*_LINEAR, "start_max_iter")
_MLP = ("hidden_layer_sizes", "activation", "alpha", "start_max_iter", "seed")

MODELS: tuple[Model, ...] = (
    # Ridge at model.alpha (alpha=0: least squares), written as MatMul + Add
    Model("linear", "sklearn.linear_model.Ridge", "regression", _LINEAR),
    Model("mlp_regressor", "sklearn.neural_network.MLPRegressor", "regression", _MLP),
    Model("logistic", "sklearn.linear_model.LogisticRegression", "classification",
          ("C", "fit_intercept", "start_max_iter")),
    Model("mlp_classifier", "sklearn.neural_network.MLPClassifier", "classification", _MLP),
    Model("ridge", "sklearn.linear_model.Ridge", "regression", _LINEAR),
    Model("lasso", "sklearn.linear_model.Lasso", "regression", _ITERATIVE),
    Model("elastic_net", "sklearn.linear_model.ElasticNet", "regression", (*_ITERATIVE, "l1_ratio")),
    Model("sgd_regressor", "sklearn.linear_model.SGDRegressor", "regression", (*_ITERATIVE, "sgd_loss", "seed"),
          {"loss": "squared_error"}),
    Model("huber", "sklearn.linear_model.HuberRegressor", "regression", (*_ITERATIVE, "epsilon")),
    Model("quantile", "sklearn.linear_model.QuantileRegressor", "regression", (*_LINEAR, "quantile"),
          {"solver": "highs"}),
    Model("sgd_classifier", "sklearn.linear_model.SGDClassifier", "classification",
          (*_ITERATIVE, "sgd_loss", "seed"), {"loss": "log_loss"}),
    Model("linear_svc", "sklearn.svm.LinearSVC", "classification", ("C", "fit_intercept", "start_max_iter")),
    Model("linear_svr", "sklearn.svm.LinearSVR", "regression", ("C", "epsilon", "fit_intercept", "start_max_iter")),
    Model("poisson", "sklearn.linear_model.PoissonRegressor", "regression", _ITERATIVE, log_link=True),
    Model("onnx", None, None),  # your own ONNX graph (model.path): no scikit-learn model, the task is the data's
)
#: name -> model
BY_NAME = {m.name: m for m in MODELS}
#: ``model.name`` -> its task (model=onnx takes the data's, so it is not here)
MODEL_TASK = {m.name: m.task for m in MODELS if m.task}
#: the models whose graph outputs the linear predictor of a log link, by ``model.name`` and by estimator class
LOG_LINK_MODELS = tuple(m.name for m in MODELS if m.log_link)
LOG_LINK = tuple(m.class_name for m in MODELS if m.log_link)


def estimator_arguments(model: Model, settings: Any, seed: int) -> dict[str, Any]:
    """The parameters of ``model``'s class from the config's ``model`` group ``settings`` and ``seed``."""
    arguments = dict(model.defaults)
    for key in model.settings:
        value = seed if key == "seed" else settings[key]
        if isinstance(value, Enum):  # a choice of the schema (activation)
            value = value.value
        if key == "hidden_layer_sizes":
            value = tuple(value)
        if value is not None:
            arguments[RENAMED.get(key, key)] = value
    return arguments
