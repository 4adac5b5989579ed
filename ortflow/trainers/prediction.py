"""Prediction and scoring of a fitted trainer (:class:`PredictionMixin`): ``predict``, ``predict_proba`` (classifier
graphs only), ``score``, ``classes_``, the per-sample ``losses`` and the scikit-learn tags, on an inference session
of the trained prediction graph."""

from __future__ import annotations

import numpy as np
from sklearn.utils.metaestimators import available_if

from ..graph import editing as g
from ..convert.sklearn import graph_classes
from ..data.graph_spec import encoded_targets, fitted_names, fitted_width
from ..runtime.sessions import OnnxFunction, make_session
from ..runtime.validation import check_targets


class PredictionMixin:
    """What :class:`ortflow.trainers.base.BaseTrainer` predicts with, through its ``_spec``, ``get_trained_onnx``,
    ``_session_options``, ``device`` and ``_loss_object``."""

    def predict(self, X) -> np.ndarray:
        """Labels for a classifier graph, else the trained output (raveled when it has one column)."""
        outputs = self._run_prediction(X)
        name = "output_label" if "output_label" in outputs else self._spec.trained_output or next(iter(outputs))
        pred = outputs[name]
        return pred.ravel() if pred.ndim == 2 and pred.shape[1] == 1 else pred

    @available_if(lambda self: has_probabilities(self))
    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities (classifier graphs with an ``output_probability`` output; a trainer of any other
        graph has no ``predict_proba``, so ``hasattr`` tells scikit-learn's tools which it is)."""
        return self._run_prediction(X)["output_probability"]

    def score(self, X, y, sample_weight=None) -> float:
        """Accuracy for a classifier graph, R² otherwise."""
        from sklearn.metrics import accuracy_score, r2_score

        pred = self.predict(X)
        if self._is_classifier():
            return float(accuracy_score(np.asarray(y).ravel(), pred, sample_weight=sample_weight))
        y = np.asarray(y)
        return float(r2_score(y.reshape(pred.shape), pred, sample_weight=sample_weight))

    def _is_classifier(self) -> bool:
        self._check_fitted()
        return "output_label" in self._spec.prediction_outputs

    @property
    def classes_(self) -> np.ndarray:
        """The classes of a classifier graph (the order of ``predict_proba``'s columns)."""
        self._check_fitted()
        if self._spec.classes is None:
            raise AttributeError(f"{type(self).__name__} trains a graph that carries no classes (not a classifier)")
        return self._spec.classes

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        if graph_is_classifier(self.model_onnx):
            from sklearn.utils import ClassifierTags

            tags.estimator_type = "classifier"
            tags.classifier_tags = ClassifierTags()
        return tags

    def _run_prediction(self, X, names: list[str] | None = None) -> dict[str, np.ndarray]:
        return self._run_feeds(self._feeds(X), names)

    def _run_feeds(self, feeds: dict[str, np.ndarray], names: list[str] | None = None) -> dict[str, np.ndarray]:
        if self._predict_sess is None:
            self._predict_sess = make_session(self.get_trained_onnx(), self._placement(), self._session_options())
        names = names or self._spec.prediction_outputs
        return dict(zip(names, self._predict_sess.run(names, feeds)))

    def _feeds(self, X) -> dict[str, np.ndarray]:
        """``X`` as the prediction graph's feeds, checked against what fit saw (width, column names)."""
        self._check_fitted()
        return self._spec.inputs.feeds(X, fitted_width(self), fitted_names(self))[0]

    def losses(self, X, y, sample_weight=None) -> np.ndarray:
        """The loss of every sample under the trained weights, ``w * l`` (no penalty): shape (n,)."""
        feeds = self._feeds(X)
        y, w = check_targets(encoded_targets(self._spec, y), sample_weight, len(next(iter(feeds.values()))),
                             self._spec.label_shape)
        output = self._spec.trained_output
        prediction = self._run_feeds(feeds, [output])[output]
        rank = prediction.ndim
        width = prediction.shape[1] if rank == 2 else None
        loss = self._loss_object()
        function = OnnxFunction(loss.build_per_sample_function(rank=rank, width=width), "cpu")
        per = function.run(prediction, y.reshape(prediction.shape))[0].numpy()
        return per if w is None else per * w

    def _loss_object(self):
        raise NotImplementedError


def has_probabilities(trainer) -> bool:
    """Whether the trainer's graph outputs ``output_probability`` (its prediction graph once fitted)."""
    spec = getattr(trainer, "_spec", None)
    if spec is not None:
        return "output_probability" in spec.prediction_outputs
    try:
        return any(o.name == "output_probability" for o in g.load_model(trainer.model_onnx).graph.output)
    except Exception:  # noqa: BLE001 - fit reports an unreadable graph with the reason
        return False


def graph_is_classifier(model_onnx) -> bool:
    """Whether ``model_onnx`` (not yet validated) carries classes; False when it cannot be read."""
    try:
        return graph_classes(model_onnx) is not None
    except Exception:  # noqa: BLE001 - fit reports an unreadable graph with the reason
        return False
