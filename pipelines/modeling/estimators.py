"""scikit-learn estimators from ``cfg.model`` and the ONNX graph surgery the pipelines need around them.

Two fits of the configured estimator are made by ``convert``: the *start* (:func:`build_estimator`, capped at
``model.start_max_iter`` iterations: the under-trained weights ONNX training begins from) and the scikit-learn
*reference* (:func:`reference_estimator`: the same estimator with its own solver and its class's default
iterations, fitted to convergence), whose test metrics ``evaluate`` logs as ``sklearn_test_*`` next to the
start's ``start_test_*``."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
from omegaconf import DictConfig
from onnx import helper

from ..base.models import BY_NAME, LOG_LINK, LOG_LINK_MODELS, estimator_arguments


def build_estimator(model: DictConfig, seed: int):
    """The scikit-learn estimator of ``model.name`` (:data:`pipelines.base.models.MODELS`) with its settings."""
    import importlib

    entry = BY_NAME[str(model.name)]
    module, _, name = entry.estimator.rpartition(".")
    return getattr(importlib.import_module(module), name)(**estimator_arguments(entry, model, seed))


def build_preprocessing(kinds: dict[str, str], treatments: dict[str, str] | None = None):
    """The ColumnTransformer ``preprocess=auto`` fits in front of the model: :func:`ortflow.data.preprocessing.make_preprocessing`."""
    from ortflow.data.preprocessing import make_preprocessing

    return make_preprocessing(kinds, treatments)


def reference_estimator(start):
    """The scikit-learn reference of a start estimator: a clone with the iterations its class takes by default
    (its own solver unchanged), to be fitted to convergence. An estimator without ``max_iter`` (least squares,
    Ridge) is solved exactly: the clone equals the start."""
    import inspect

    from sklearn.base import clone

    reference = clone(start)
    final = _final(reference)  # a Pipeline (preprocess=auto): its model's iterations
    if "max_iter" in final.get_params(deep=False):
        default = inspect.signature(type(final)).parameters["max_iter"].default
        final.set_params(max_iter=default)
    return reference


def _final(estimator):
    """The model of a Pipeline (its last step), the estimator itself otherwise."""
    return estimator.steps[-1][1] if hasattr(estimator, "steps") else estimator


def fit_summary(estimator) -> dict:
    """How a fitted estimator's solver ended: ``max_iter``, the iterations it ran (``n_iter``) and whether it
    converged (fewer iterations than allowed); an exact solver has none of them and counts as converged."""
    estimator = _final(estimator)
    params = estimator.get_params(deep=False)
    if "max_iter" not in params or getattr(estimator, "n_iter_", None) is None:  # Ridge's direct solvers: None
        return {"solver": "exact", "converged": True}
    n_iter = int(np.max(np.atleast_1d(estimator.n_iter_)))
    return {"solver": str(params.get("solver", "")), "max_iter": int(params["max_iter"]), "n_iter": n_iter,
            "converged": n_iter < int(params["max_iter"])}


def fit_estimator(estimator, X: np.ndarray, y: np.ndarray, task: str, quiet: bool = True):
    """Fit; ``quiet``: without scikit-learn's ConvergenceWarning (the start stops early on purpose; a reference
    that does not converge says so in :func:`fit_summary`)."""
    from sklearn.exceptions import ConvergenceWarning

    target = y if task == "classification" else y.astype(np.float64)  # class labels as the data has them
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore", ConvergenceWarning)
        estimator.fit(X, target)
    return estimator


def sklearn_predict(estimator, X: np.ndarray, task: str) -> np.ndarray:
    """Regression predictions (n,), or the class probabilities (n, k), columns in ``estimator.classes_`` order."""
    if task == "classification":
        if not hasattr(estimator, "predict_proba"):  # LinearSVC, SGDClassifier(hinge): ortflow's graph's sigmoid
            scores = np.asarray(estimator.decision_function(X), dtype=np.float64).reshape(len(X), -1)
            if scores.shape[1] == 1:
                positive = 1.0 / (1.0 + np.exp(-scores[:, 0]))
                return np.column_stack([1.0 - positive, positive])
            scores = np.exp(scores - scores.max(axis=1, keepdims=True))
            return scores / scores.sum(axis=1, keepdims=True)
        return np.asarray(estimator.predict_proba(X), dtype=np.float64)
    return np.asarray(estimator.predict(X), dtype=np.float64).reshape(len(X), -1)[:, 0]


def with_scaling(onx: onnx.ModelProto, x_mean: np.ndarray, x_scale: np.ndarray, y_mean: float = 0.0,
                 y_scale: float = 1.0, input_name: str = "X", output_name: str = "variable") -> onnx.ModelProto:
    """A copy of ``onx`` that takes raw features and, for a regressor, returns predictions in the target's units.

    Training runs on standardized data; the exported model should not ask users to standardize. The graph gets
    ``X_std = (X - x_mean) / x_scale`` in front (not when ``x_mean`` is empty: a table's graph scales inside) and ``y = y_std * y_scale + y_mean`` behind ``output_name``
    (when the graph has that output and the target was standardized). The statistics are constants, not
    trainable weights.
    """
    from ortflow.package.graphs import standardize_input, unscale_output

    model = onnx.ModelProto()
    model.CopyFrom(onx)
    if len(x_mean):
        model = standardize_input(model, input_name, x_mean, x_scale, "scaling_x_")
    if output_name in [o.name for o in model.graph.output] and (y_mean != 0.0 or y_scale != 1.0):
        model = unscale_output(model, output_name, [y_mean], [y_scale], "scaling_y_")
    onnx.checker.check_model(model)
    return model


def with_mean(onx: onnx.ModelProto, model_name: str | None = None, output_name: str = "variable") -> onnx.ModelProto:
    """``onx`` answering the mean scikit-learn predicts: ``exp`` of ``output_name`` for a log-link GLM
    (:data:`pipelines.base.models.LOG_LINK`, read from the graph's estimator record; a trained graph has none,
    so ``model_name``, the config's ``model.name``, says it too), else ``onx`` unchanged."""
    from ortflow.convert.sklearn import estimator_record

    if estimator_record(onx).get("class") not in LOG_LINK and model_name not in LOG_LINK_MODELS:
        return onx
    model = onnx.ModelProto()
    model.CopyFrom(onx)
    inner = "link_linear_predictor"
    for node in model.graph.node:
        node.output[:] = [inner if n == output_name else n for n in node.output]
        node.input[:] = [inner if n == output_name else n for n in node.input]
    model.graph.node.append(helper.make_node("Exp", [inner], [output_name], name="link_mean"))
    onnx.checker.check_model(model)
    return model
