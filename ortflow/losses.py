"""The loss family: each loss is defined once, by its per-element value and derivative with respect to the score.

From that one definition come both the loss nodes :func:`ortflow.add_loss_output` appends to a graph (full
training differentiates them with onnxruntime) and the loss-and-gradient graph forward-backward training runs.
With ``w`` the per-sample weight (1 when absent), ``N`` the number of samples and ``l`` the per-sample loss (the
per-element values summed over the output columns), ``loss = sum(w * l) / N``.

To add a loss: subclass :class:`BaseLearningLoss`, declare ``names`` (registry names, the first canonical) and
``task``, implement :meth:`~BaseLearningLoss._per_sample` (per element) and :meth:`~BaseLearningLoss._derivative`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import onnx
from onnx import TensorProto
from sklearn.base import BaseEstimator

from .onnx_builder import DEFAULT_OPSET, GraphBuilder
from .registry import Registered
from .runtime import OnnxFunction, OrtValue, to_ortvalue

PREDICTION = "prediction"
LABEL = "label"
LOSS = "loss"
LOSS_GRAD = "loss_grad"


class BaseLearningLoss(Registered, BaseEstimator):
    """A loss of a prediction (a score) and a label of the same shape, (N,) or (N, k)."""

    kind = "loss"
    #: 'regression' or 'classification': the data a loss fits (the pipelines check it against the data)
    task: ClassVar[str] = "regression"

    # --- the definition -------------------------------------------------------------------------------------
    def _per_sample(self, b: GraphBuilder, pred: str, label: str) -> str:
        """Per-element loss l(prediction, label), before the sum over the output columns (the name is onnxcustom's:
        one value per sample for a one-column prediction)."""
        raise NotImplementedError

    def _derivative(self, b: GraphBuilder, pred: str, label: str) -> str:
        """Per-element derivative dl/dprediction."""
        raise NotImplementedError

    def check(self) -> None:
        """Raise ValueError on an invalid hyper-parameter."""

    # --- nodes built from it --------------------------------------------------------------------------------
    def sample_losses(self, b: GraphBuilder, pred: str, label: str, rank: int, width: int | None = None) -> str:
        """Nodes computing the per-sample loss, shape (N,), of predictions of rank ``rank`` and ``width``
        columns (None: unknown)."""
        per = self._per_sample(b, pred, label)
        return b.node("ReduceSum", [per, _inner_axes(b, rank)], keepdims=0) if rank > 1 else per

    def gradient(self, b: GraphBuilder, pred: str, label: str, width: int | None = None) -> str:
        """Nodes computing d(per-sample loss)/d(prediction), shaped like the prediction."""
        return self._derivative(b, pred, label)

    def mean_loss(self, b: GraphBuilder, pred: str, label: str, weight: str | None, rank: int,
                  width: int | None = None) -> str:
        """Nodes computing ``mean(w * l)`` (a scalar); ``weight`` has shape (N,) or is None."""
        per = self.sample_losses(b, pred, label, rank, width)
        if weight is not None:
            per = b.node("Mul", [per, weight])
        return b.node("ReduceMean", [per], keepdims=0)

    def build_onnx_function(self, opset: int = DEFAULT_OPSET, device: str = "cpu", weight_name: str | None = None,
                            rank: int = 2, scaled_weight: bool = False, width: int | None = None) -> onnx.ModelProto:
        """The loss graph: inputs ``prediction``, ``label`` [, ``weight_name``] of rank ``rank`` ((N,) is 1,
        (N, k) is 2); outputs ``loss`` (a scalar) and ``loss_grad`` (the gradient of ``loss`` with respect to the
        prediction). The weight has shape (N,).

        ``scaled_weight=True`` (with a ``weight_name``) expects the weight already divided by N and shaped
        (N, 1, ...) like the prediction's rank, which saves the trainer nodes per batch.
        ``device`` does not change the graph: every op runs on CPU and CUDA."""
        self.check()
        if rank < 1:
            raise ValueError(f"rank={rank!r} must be 1 or more (samples lie along the first axis)")
        if scaled_weight and not weight_name:
            raise ValueError("scaled_weight=True needs a weight_name")
        b = GraphBuilder(prefix="loss")
        dims = ["N"] + [width] * (rank - 1)
        pred, label = b.input(PREDICTION, dims), b.input(LABEL, dims)
        weight = b.input(weight_name, ["N"] + [1] * (rank - 1) if scaled_weight else ["N"]) if weight_name else None
        derivative = self.gradient(b, pred, label, width)
        if scaled_weight:  # sum(w / N * l) and w / N * dl
            per = self.sample_losses(b, pred, label, rank, width)
            flat = b.node("Reshape", [weight, b.const([-1], dtype="int64")]) if rank > 1 else weight
            b.output(b.node("ReduceSum", [b.node("Mul", [per, flat])], keepdims=0), LOSS, [])
            b.output(b.node("Mul", [derivative, weight]), LOSS_GRAD, dims)
            return b.model(opset, name=type(self).__name__)
        b.output(self.mean_loss(b, pred, label, weight, rank, width), LOSS, [])
        if weight:
            n = b.node("Cast", [b.node("Size", [weight])], to=TensorProto.FLOAT)
            scale = b.node("Div", [weight, n])
            if rank > 1:
                scale = b.node("Unsqueeze", [scale, _inner_axes(b, rank)])
        else:
            first = b.node("Gather", [b.node("Shape", [pred]), b.const(0, dtype="int64")])
            scale = b.node("Reciprocal", [b.node("Cast", [first], to=TensorProto.FLOAT)])
        b.output(b.node("Mul", [derivative, scale]), LOSS_GRAD, dims)
        return b.model(opset, name=type(self).__name__)

    def build_per_sample_function(self, opset: int = DEFAULT_OPSET, rank: int = 2,
                                  width: int | None = None) -> onnx.ModelProto:
        """A graph ``prediction``, ``label`` -> ``loss`` of shape (N,): the loss of every sample."""
        self.check()
        b = GraphBuilder(prefix="loss")
        dims = ["N"] + [width] * (rank - 1)
        per = self.sample_losses(b, b.input(PREDICTION, dims), b.input(LABEL, dims), rank, width)
        b.output(b.node("Identity", [per]), LOSS, ["N"])
        return b.model(opset, name=f"{type(self).__name__}_per_sample")

    # --- running it -----------------------------------------------------------------------------------------
    def function(self, device: str = "cpu", weight_name: str | None = None, rank: int = 2, session_options=None,
                 opset: int = DEFAULT_OPSET, width: int | None = None) -> OnnxFunction:
        """The loss graph loaded in a session on ``device`` (cached per device, weight name, rank, opset, width)."""
        cache = self.__dict__.setdefault("_functions", {})
        key = (device, weight_name, rank, opset, width)
        if key not in cache:
            model = self.build_onnx_function(opset, device, weight_name, rank, width=width)
            cache[key] = OnnxFunction(model, device, session_options)
        return cache[key]

    def loss_gradient(self, device: str, expected: Any, predicted: Any,
                      weight: Any = None) -> tuple[OrtValue, OrtValue]:
        """(loss, gradient w.r.t. ``predicted``) as OrtValues on ``device``; inputs are OrtValues or arrays."""
        predicted = to_ortvalue(predicted, device)
        shape = predicted.shape()
        width = shape[1] if len(shape) == 2 else None
        if weight is None:
            return tuple(self.function(device, None, len(shape), width=width).run(predicted, expected))
        return tuple(self.function(device, "weight", len(shape), width=width).run(predicted, expected, weight))

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_functions", None)
        return state


def _inner_axes(b: GraphBuilder, rank: int) -> str:
    return b.const(list(range(1, rank)), dtype="int64")


class SquareLearningLoss(BaseLearningLoss):
    """``l = (prediction - label) ** 2``."""

    names = ("squared_error", "square_error", "square", "l2")

    def __init__(self):
        pass

    def _per_sample(self, b, pred, label):
        diff = b.node("Sub", [pred, label])
        return b.node("Mul", [diff, diff])

    def _derivative(self, b, pred, label):
        return b.node("Mul", [b.node("Sub", [pred, label]), b.const(2.0)])


class AbsoluteLearningLoss(BaseLearningLoss):
    """``l = |prediction - label|`` (gradient ``sign(prediction - label)``, 0 where they are equal)."""

    names = ("absolute_error", "absolute", "l1")

    def __init__(self):
        pass

    def _per_sample(self, b, pred, label):
        return b.node("Abs", [b.node("Sub", [pred, label])])

    def _derivative(self, b, pred, label):
        return b.node("Sign", [b.node("Sub", [pred, label])])


class ElasticLearningLoss(BaseLearningLoss):
    """``l = l1_weight * |d| + l2_weight * d ** 2`` with ``d = prediction - label``."""

    names = ("elastic",)

    def __init__(self, l1_weight: float = 0.5, l2_weight: float = 0.5):
        self.l1_weight = l1_weight
        self.l2_weight = l2_weight

    def check(self) -> None:
        _check_non_negative(self, "l1_weight", "l2_weight")

    def _per_sample(self, b, pred, label):
        diff = b.node("Sub", [pred, label])
        l1 = b.node("Mul", [b.node("Abs", [diff]), b.const(self.l1_weight)])
        return b.node("Add", [l1, b.node("Mul", [b.node("Mul", [diff, diff]), b.const(self.l2_weight)])])

    def _derivative(self, b, pred, label):
        diff = b.node("Sub", [pred, label])
        l1 = b.node("Mul", [b.node("Sign", [diff]), b.const(self.l1_weight)])
        return b.node("Add", [l1, b.node("Mul", [diff, b.const(2.0 * self.l2_weight)])])


class NegLogLearningLoss(BaseLearningLoss):
    """Log loss of raw scores ``s`` (before the sigmoid or softmax).

    One column (binary): label ``y`` in {0, 1}, ``l = log(1 + exp(s)) - y * s``, computed as
    ``relu(s) - y * s + log(1 + exp(-|s|))``, with gradient ``p - y``, ``p = sigmoid(s)`` clipped to
    ``[eps, 1 - eps]`` (the exact derivative wherever ``|s| < log((1 - eps) / eps)``; ``eps=0``: exact everywhere).
    k >= 2 columns: ``y`` one-hot, ``l = -sum(y * log_softmax(s))`` (log-sum-exp, stable), gradient
    ``softmax(s) - y``. The trainers turn class labels into these targets.
    """

    names = ("log", "neg_log")
    task = "classification"

    def __init__(self, eps: float = 1e-5):
        self.eps = eps

    def check(self) -> None:
        if not 0.0 <= float(self.eps) < 0.5:
            raise ValueError(f"eps={self.eps!r} must be in [0, 0.5)")

    def sample_losses(self, b, pred, label, rank, width=None):
        if _multiclass(rank, width):
            log_proba = b.node("LogSoftmax", [pred], axis=1)
            total = b.node("ReduceSum", [b.node("Mul", [label, log_proba]), _inner_axes(b, rank)], keepdims=0)
            return b.node("Neg", [total])
        return super().sample_losses(b, pred, label, rank, width)

    def gradient(self, b, pred, label, width=None):
        if width is not None and width > 1:
            return b.node("Sub", [b.node("Softmax", [pred], axis=1), label])
        return super().gradient(b, pred, label, width)

    def _per_sample(self, b, pred, label):
        soft = b.node("Log", [b.node("Add", [b.const(1.0), b.node("Exp", [b.node("Neg", [b.node("Abs", [pred])])])])])
        return b.node("Sub", [b.node("Add", [b.node("Relu", [pred]), soft]), b.node("Mul", [label, pred])])

    def _derivative(self, b, pred, label):
        eps = float(self.eps)
        proba = b.node("Sigmoid", [pred])
        if eps > 0:
            proba = b.node("Clip", [proba, b.const(eps), b.const(1.0 - eps)])
        return b.node("Sub", [proba, label])


def _multiclass(rank: int, width: int | None) -> bool:
    return rank == 2 and width is not None and width > 1


def _check_non_negative(obj: BaseEstimator, *names: str) -> None:
    import math

    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{type(obj).__name__}: {name}={value!r} must be a finite number >= 0")
