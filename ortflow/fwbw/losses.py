"""Learning losses: an ONNX graph computing the loss and its gradient with respect to the prediction.

Every loss follows :func:`ortflow.add_loss_output`: with ``w`` the per-sample weight (1 when absent), ``N`` the
number of samples and ``l`` a per-sample value summed over the output columns, ``loss = sum(w * l) / N``. The
gradient is the exact derivative of that mean, so forward-backward and full training follow the same path.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import TensorProto
from sklearn.base import BaseEstimator

from .forward_backward import DEFAULT_OPSET, GraphBuilder, OnnxFunction, OrtValue, Registered, to_ortvalue

PREDICTION = "prediction"
LABEL = "label"
LOSS = "loss"
LOSS_GRAD = "loss_grad"


class BaseLearningLoss(Registered, BaseEstimator):
    """A loss graph: inputs ``prediction``, ``label`` [, ``weight_name``]; outputs ``loss`` (a scalar) and
    ``loss_grad`` (shaped like the prediction). Subclasses implement :meth:`_per_sample` and :meth:`_derivative`."""

    kind = "loss"

    def build_onnx_function(self, opset: int = DEFAULT_OPSET, device: str = "cpu", weight_name: str | None = None,
                            rank: int = 2, scaled_weight: bool = False) -> onnx.ModelProto:
        """The loss graph for predictions of rank ``rank`` ((N,) is 1, (N, k) is 2); the weight has shape (N,).

        ``scaled_weight=True`` (with a ``weight_name``) expects the weight already divided by N and shaped
        (N, 1, ...) like the prediction's rank, which saves the trainer five nodes per batch.
        ``device`` does not change the graph: every op runs on CPU and CUDA."""
        if rank < 1:
            raise ValueError(f"rank={rank!r} must be 1 or more (samples lie along the first axis)")
        if scaled_weight and not weight_name:
            raise ValueError("scaled_weight=True needs a weight_name")
        b = GraphBuilder(prefix="loss")
        dims = ["N"] + [None] * (rank - 1)
        pred, label = b.input(PREDICTION, dims), b.input(LABEL, dims)
        weight = b.input(weight_name, ["N"] + [1] * (rank - 1) if scaled_weight else ["N"]) if weight_name else None
        inner = b.const(list(range(1, rank)), dtype="int64") if rank > 1 else None
        per = self._per_sample(b, pred, label)
        derivative = self._derivative(b, pred, label)
        if scaled_weight:  # sum(w / N * l) and w / N * dl
            loss = b.node("ReduceSum", [b.node("Mul", [per, weight])], keepdims=0)
            b.output(loss, LOSS, [])
            b.output(b.node("Mul", [derivative, weight]), LOSS_GRAD, dims)
            return b.model(opset, name=type(self).__name__)
        if inner:
            per = b.node("ReduceSum", [per, inner], keepdims=0)
        if weight:
            per = b.node("Mul", [per, weight])
        loss = b.node("ReduceSum", [per], keepdims=0)
        if weight:
            n = b.node("Cast", [b.node("Size", [weight])], to=TensorProto.FLOAT)
            scale = b.node("Div", [weight, n])
            if inner:
                scale = b.node("Unsqueeze", [scale, inner])
        else:
            first = b.node("Gather", [b.node("Shape", [pred]), b.const(0, dtype="int64")])
            n = b.node("Cast", [first], to=TensorProto.FLOAT)
            scale = b.node("Reciprocal", [n])
        b.output(b.node("Div", [loss, n]), LOSS, [])
        b.output(b.node("Mul", [derivative, scale]), LOSS_GRAD, dims)
        return b.model(opset, name=type(self).__name__)

    def _per_sample(self, b: GraphBuilder, pred: str, label: str) -> str:
        """Per-element loss l(prediction, label), before the sum over the output columns."""
        raise NotImplementedError

    def _derivative(self, b: GraphBuilder, pred: str, label: str) -> str:
        """Per-element derivative dl/dprediction."""
        raise NotImplementedError

    def function(self, device: str = "cpu", weight_name: str | None = None, rank: int = 2, session_options=None,
                 opset: int = DEFAULT_OPSET) -> OnnxFunction:
        """The loss graph loaded in a session on ``device`` (cached per device, weight name, rank and opset)."""
        cache = self.__dict__.setdefault("_functions", {})
        key = (device, weight_name, rank, opset)
        if key not in cache:
            model = self.build_onnx_function(opset, device, weight_name, rank)
            cache[key] = OnnxFunction(model, device, session_options)
        return cache[key]

    def loss_gradient(self, device: str, expected: Any, predicted: Any,
                      weight: Any = None) -> tuple[OrtValue, OrtValue]:
        """(loss, gradient w.r.t. ``predicted``) as OrtValues on ``device``; inputs are OrtValues or arrays."""
        predicted = to_ortvalue(predicted, device)
        rank = len(predicted.shape())
        if weight is None:
            return tuple(self.function(device, None, rank).run(predicted, expected))
        return tuple(self.function(device, "weight", rank).run(predicted, expected, weight))

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_functions", None)
        return state


class SquareLearningLoss(BaseLearningLoss):
    """``l = (prediction - label) ** 2``."""

    names = ("square_error", "squared_error")

    def __init__(self):
        pass

    def _per_sample(self, b, pred, label):
        diff = b.node("Sub", [pred, label])
        return b.node("Mul", [diff, diff])

    def _derivative(self, b, pred, label):
        return b.node("Mul", [b.node("Sub", [pred, label]), b.const(2.0)])


class AbsoluteLearningLoss(BaseLearningLoss):
    """``l = |prediction - label|`` (gradient ``sign(prediction - label)``, 0 where they are equal)."""

    names = ("absolute_error",)

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

    def _per_sample(self, b, pred, label):
        diff = b.node("Sub", [pred, label])
        l1 = b.node("Mul", [b.node("Abs", [diff]), b.const(self.l1_weight)])
        return b.node("Add", [l1, b.node("Mul", [b.node("Mul", [diff, diff]), b.const(self.l2_weight)])])

    def _derivative(self, b, pred, label):
        diff = b.node("Sub", [pred, label])
        l1 = b.node("Mul", [b.node("Sign", [diff]), b.const(self.l1_weight)])
        return b.node("Add", [l1, b.node("Mul", [diff, b.const(2.0 * self.l2_weight)])])


class NegLogLearningLoss(BaseLearningLoss):
    """Binary log loss of a raw score ``s`` (before the sigmoid) and a label ``y`` in {0, 1}.

    ``l = log(1 + exp(s)) - y * s``, computed as ``relu(s) - y * s + log(1 + exp(-|s|))``: no log of a probability,
    so nothing overflows or reaches log(0). The gradient is ``p - y`` with ``p = sigmoid(s)`` clipped to
    ``[eps, 1 - eps]``: the exact derivative wherever ``|s| < log((1 - eps) / eps)`` (about 11.5 for the default);
    ``eps=0`` makes it exact everywhere.
    """

    names = ("neg_log", "log")

    def __init__(self, eps: float = 1e-5):
        self.eps = eps

    def _per_sample(self, b, pred, label):
        soft = b.node("Log", [b.node("Add", [b.const(1.0), b.node("Exp", [b.node("Neg", [b.node("Abs", [pred])])])])])
        return b.node("Sub", [b.node("Add", [b.node("Relu", [pred]), soft]), b.node("Mul", [label, pred])])

    def _derivative(self, b, pred, label):
        eps = float(self.eps)
        if not 0.0 <= eps < 0.5:
            raise ValueError(f"eps={self.eps!r} must be in [0, 0.5)")
        proba = b.node("Sigmoid", [pred])
        if eps > 0:
            proba = b.node("Clip", [proba, b.const(eps), b.const(1.0 - eps)])
        return b.node("Sub", [proba, label])
