"""The loss family: each loss is defined once, by its per-element value and derivative with respect to the score.

From that one definition come both the loss nodes :func:`ortflow.add_loss_output` appends to a graph (full
training differentiates them with onnxruntime) and the loss-and-gradient graph forward-backward training runs.
With ``w`` the per-sample weight (1 when absent), ``N`` the number of samples and ``l`` the per-sample loss (the
per-element values summed over the output columns), ``loss = sum(w * l) / N``.

The losses of scikit-learn's estimators (Huber, epsilon-insensitive, hinge, quantile, Poisson...) follow its
definitions exactly; docs/LOSSES.md lists them and which estimator takes which by default.

To add a loss: subclass :class:`BaseLearningLoss`, declare ``names`` (registry names, the first canonical) and
``task``, implement :meth:`~BaseLearningLoss._per_sample` (per element) and :meth:`~BaseLearningLoss._derivative`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import onnx
from onnx import TensorProto

from ..graph.builder import DEFAULT_OPSET, GraphBuilder
from ..registry import Parametrized, Registered
from ..runtime.sessions import OnnxFunction, OrtValue, to_ortvalue

PREDICTION = "prediction"
LABEL = "label"
LOSS = "loss"
LOSS_GRAD = "loss_grad"


class BaseLearningLoss(Registered, Parametrized):
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
        """(loss, gradient w.r.t. ``predicted``) as OrtValues on ``device``; inputs are OrtValues or arrays.

        The arguments come in onnxcustom's order (``expected``, the label, before ``predicted``), kept for its
        users; the loss graph itself takes ``prediction`` then ``label``. Pass them by name to avoid the swap:
        ``loss_gradient(device, expected=y, predicted=p)``."""
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


class LogCoshLearningLoss(BaseLearningLoss):
    """``l = scale ** 2 * log(cosh(r / scale))``, ``r = prediction - label``: ``r ** 2 / 2`` near 0 and
    ``scale * |r|`` far from it (a smooth Huber loss, ``scale`` its threshold); derivative ``scale * tanh(r / scale)``.
    Written ``|x| + log(1 + exp(-2 |x|)) - log 2`` for ``log(cosh(x))``, which overflows nowhere."""

    names = ("log_cosh",)

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def check(self) -> None:
        _check_non_negative(self, "scale")
        if not self.scale > 0:
            raise ValueError(f"{type(self).__name__}: scale={self.scale!r} must be > 0")

    def _per_sample(self, b, pred, label):
        c = float(self.scale)
        x = b.node("Abs", [b.node("Mul", [b.node("Sub", [pred, label]), b.const(1.0 / c)])])
        soft = b.node("Log", [b.node("Add", [b.const(1.0), b.node("Exp", [b.node("Mul", [x, b.const(-2.0)])])])])
        log_cosh = b.node("Sub", [b.node("Add", [x, soft]), b.const(math.log(2.0))])
        return b.node("Mul", [log_cosh, b.const(c * c)])

    def _derivative(self, b, pred, label):
        c = float(self.scale)
        return b.node("Mul", [b.node("Tanh", [b.node("Mul", [b.node("Sub", [pred, label]), b.const(1.0 / c)])]),
                              b.const(c)])


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


def _check_non_negative(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{type(obj).__name__}: {name}={value!r} must be a finite number >= 0")


# --- scikit-learn's own losses (sklearn/_loss/loss.py, sklearn/linear_model/_sgd_fast.pyx.tp) ----------------------
# Each equals scikit-learn's per-element loss, and its derivative scikit-learn's at the kinks too.


class HalfSquaredLearningLoss(BaseLearningLoss):
    """``l = (prediction - label) ** 2 / 2``: scikit-learn's HalfSquaredError (Lasso, ElasticNet, SGD's
    'squared_error')."""

    names = ("half_squared_error",)

    def __init__(self):
        pass

    def _per_sample(self, b, pred, label):
        diff = b.node("Sub", [pred, label])
        return b.node("Mul", [b.node("Mul", [diff, diff]), b.const(0.5)])

    def _derivative(self, b, pred, label):
        return b.node("Sub", [pred, label])


class HuberLearningLoss(BaseLearningLoss):
    """Huber with a fixed threshold ``epsilon`` on ``r = prediction - label``: ``r ** 2 / 2`` where
    ``|r| <= epsilon``, ``epsilon * (|r| - epsilon / 2)`` beyond (SGDRegressor(loss='huber', epsilon=...),
    scikit-learn's HuberLoss with ``delta=epsilon``); derivative ``clip(r, -epsilon, epsilon)``."""

    names = ("huber",)

    def __init__(self, epsilon: float = 0.1):
        self.epsilon = epsilon

    def check(self) -> None:
        _check_non_negative(self, "epsilon")

    def _per_sample(self, b, pred, label):
        inner, outer = _split_at(b, b.node("Abs", [b.node("Sub", [pred, label])]), self.epsilon)
        square = b.node("Mul", [b.node("Mul", [inner, inner]), b.const(0.5)])
        return b.node("Add", [square, b.node("Mul", [outer, b.const(self.epsilon)])])

    def _derivative(self, b, pred, label):
        eps = float(self.epsilon)
        return b.node("Clip", [b.node("Sub", [pred, label]), b.const(-eps), b.const(eps)])


class ScaledHuberLearningLoss(BaseLearningLoss):
    """HuberRegressor's per-sample term at a fixed scale ``sigma`` (its fitted ``scale_``):
    ``l = sigma + sigma * H(r / sigma)`` with ``H(z) = z ** 2`` where ``|z| < epsilon``,
    ``2 * epsilon * |z| - epsilon ** 2`` beyond, ``r = prediction - label``. HuberRegressor also fits sigma;
    ortflow trains the weights only, sigma stays ``scale``."""

    names = ("scaled_huber",)

    def __init__(self, epsilon: float = 1.35, scale: float = 1.0):
        self.epsilon = epsilon
        self.scale = scale

    def check(self) -> None:
        _check_non_negative(self, "epsilon", "scale")
        if not self.scale > 0:
            raise ValueError(f"{type(self).__name__}: scale={self.scale!r} must be > 0")

    def _per_sample(self, b, pred, label):
        c = float(self.epsilon) * float(self.scale)
        inner, outer = _split_at(b, b.node("Abs", [b.node("Sub", [pred, label])]), c)
        quadratic = b.node("Add", [b.node("Mul", [inner, inner]), b.node("Mul", [outer, b.const(2.0 * c)])])
        return b.node("Add", [b.node("Mul", [quadratic, b.const(1.0 / float(self.scale))]), b.const(self.scale)])

    def _derivative(self, b, pred, label):
        c = float(self.epsilon) * float(self.scale)
        clipped = b.node("Clip", [b.node("Sub", [pred, label]), b.const(-c), b.const(c)])
        return b.node("Mul", [clipped, b.const(2.0 / float(self.scale))])


def _split_at(b: GraphBuilder, a: str, c: float) -> tuple[str, str]:
    """(``min(a, c)``, ``max(a - c, 0)``) of ``a >= 0``, written with Relu (differentiable everywhere)."""
    outer = b.node("Relu", [b.node("Sub", [a, b.const(c)])])
    return b.node("Sub", [a, outer]), outer


class EpsilonInsensitiveLearningLoss(BaseLearningLoss):
    """``l = max(0, |prediction - label| - epsilon)`` (SGDRegressor, LinearSVR); derivative ``sign(r)`` where
    ``|r| > epsilon``, 0 elsewhere."""

    names = ("epsilon_insensitive",)

    def __init__(self, epsilon: float = 0.1):
        self.epsilon = epsilon

    def check(self) -> None:
        _check_non_negative(self, "epsilon")

    def _per_sample(self, b, pred, label):
        return b.node("Relu", [b.node("Sub", [b.node("Abs", [b.node("Sub", [pred, label])]), b.const(self.epsilon)])])

    def _derivative(self, b, pred, label):
        diff = b.node("Sub", [pred, label])
        outside = b.node("Cast", [b.node("Greater", [b.node("Abs", [diff]), b.const(self.epsilon)])],
                         to=TensorProto.FLOAT)
        return b.node("Mul", [b.node("Sign", [diff]), outside])


class SquaredEpsilonInsensitiveLearningLoss(EpsilonInsensitiveLearningLoss):
    """``l = max(0, |prediction - label| - epsilon) ** 2``; derivative ``2 * sign(r) * max(0, |r| - epsilon)``."""

    names = ("squared_epsilon_insensitive",)

    def _per_sample(self, b, pred, label):
        outer = super()._per_sample(b, pred, label)
        return b.node("Mul", [outer, outer])

    def _derivative(self, b, pred, label):
        diff = b.node("Sub", [pred, label])
        outer = b.node("Relu", [b.node("Sub", [b.node("Abs", [diff]), b.const(self.epsilon)])])
        return b.node("Mul", [b.node("Mul", [b.node("Sign", [diff]), outer]), b.const(2.0)])


class _MarginLoss(BaseLearningLoss):
    """A binary classification loss of the margin ``z = t * s``, ``s`` the raw score (one column) and
    ``t = 2 * label - 1`` in {-1, +1} (the trainers' labels are in {0, 1}), as SGDClassifier and LinearSVC
    define it."""

    task = "classification"

    def _check_width(self, width):
        if width is not None and width > 1:
            raise ValueError(f"loss {self.names[0]!r} scores two classes (one raw-score column); the prediction has "
                             f"{width} columns: use 'log' for more classes")

    def sample_losses(self, b, pred, label, rank, width=None):
        self._check_width(width)
        return super().sample_losses(b, pred, label, rank, width)

    def gradient(self, b, pred, label, width=None):
        self._check_width(width)
        return super().gradient(b, pred, label, width)

    @staticmethod
    def _sign(b, label):
        return b.node("Sub", [b.node("Mul", [label, b.const(2.0)]), b.const(1.0)])

    def _margin(self, b, pred, label):
        sign = self._sign(b, label)
        return sign, b.node("Mul", [sign, pred])


class HingeLearningLoss(_MarginLoss):
    """``l = max(0, threshold - z)`` (SGDClassifier's 'hinge', LinearSVC(loss='hinge')); derivative ``-t`` where
    ``z <= threshold`` (scikit-learn's subgradient at the kink), 0 beyond."""

    names = ("hinge",)

    def __init__(self, threshold: float = 1.0):
        self.threshold = threshold

    def check(self) -> None:
        _check_non_negative(self, "threshold")

    def _per_sample(self, b, pred, label):
        _, z = self._margin(b, pred, label)
        below = b.node("LessOrEqual", [z, b.const(self.threshold)])
        return b.node("Where", [below, b.node("Sub", [b.const(self.threshold), z]), b.const(0.0)])

    def _derivative(self, b, pred, label):
        sign, z = self._margin(b, pred, label)
        below = b.node("Cast", [b.node("LessOrEqual", [z, b.const(self.threshold)])], to=TensorProto.FLOAT)
        return b.node("Neg", [b.node("Mul", [sign, below])])


class PerceptronLearningLoss(HingeLearningLoss):
    """``l = max(0, -z)``: the hinge at threshold 0 (Perceptron, SGDClassifier's 'perceptron')."""

    names = ("perceptron",)
    threshold = 0.0

    def __init__(self):
        pass


class SquaredHingeLearningLoss(_MarginLoss):
    """``l = max(0, 1 - z) ** 2`` (LinearSVC's default, SGDClassifier's 'squared_hinge'); derivative
    ``-2 * t * max(0, 1 - z)``."""

    names = ("squared_hinge",)

    def __init__(self):
        pass

    def _per_sample(self, b, pred, label):
        _, z = self._margin(b, pred, label)
        gap = b.node("Relu", [b.node("Sub", [b.const(1.0), z])])
        return b.node("Mul", [gap, gap])

    def _derivative(self, b, pred, label):
        sign, z = self._margin(b, pred, label)
        gap = b.node("Relu", [b.node("Sub", [b.const(1.0), z])])
        return b.node("Mul", [b.node("Mul", [sign, gap]), b.const(-2.0)])


class ModifiedHuberLearningLoss(_MarginLoss):
    """SGDClassifier's 'modified_huber': ``l = 0`` for ``z >= 1``, ``(1 - z) ** 2`` for ``-1 <= z < 1``,
    ``-4 * z`` below; with ``u = max(0, 1 - z)``: ``min(u, 2) ** 2 + 4 * max(u - 2, 0)``, derivative
    ``-2 * t * min(u, 2)``."""

    names = ("modified_huber",)

    def __init__(self):
        pass

    def _per_sample(self, b, pred, label):
        _, z = self._margin(b, pred, label)
        inner, outer = _split_at(b, b.node("Relu", [b.node("Sub", [b.const(1.0), z])]), 2.0)
        return b.node("Add", [b.node("Mul", [inner, inner]), b.node("Mul", [outer, b.const(4.0)])])

    def _derivative(self, b, pred, label):
        sign, z = self._margin(b, pred, label)
        inner, _ = _split_at(b, b.node("Relu", [b.node("Sub", [b.const(1.0), z])]), 2.0)
        return b.node("Mul", [b.node("Mul", [sign, inner]), b.const(-2.0)])


class PinballLearningLoss(BaseLearningLoss):
    """Pinball loss at ``quantile`` q (QuantileRegressor, scikit-learn's PinballLoss): ``q * (label - prediction)``
    where ``label >= prediction``, ``(1 - q) * (prediction - label)`` elsewhere; derivative ``-q`` where
    ``label >= prediction``, ``1 - q`` elsewhere."""

    names = ("quantile", "pinball")

    def __init__(self, quantile: float = 0.5):
        self.quantile = quantile

    def check(self) -> None:
        if isinstance(self.quantile, bool) or not isinstance(self.quantile, (int, float)) or \
                not 0.0 < float(self.quantile) < 1.0:
            raise ValueError(f"{type(self).__name__}: quantile={self.quantile!r} must be in (0, 1)")

    def _per_sample(self, b, pred, label):
        diff = b.node("Sub", [pred, label])
        above = b.node("Mul", [b.node("Relu", [diff]), b.const(1.0 - float(self.quantile))])
        return b.node("Add", [above, b.node("Mul", [b.node("Relu", [b.node("Neg", [diff])]), b.const(self.quantile)])])

    def _derivative(self, b, pred, label):
        at_or_below = b.node("Cast", [b.node("LessOrEqual", [pred, label])], to=TensorProto.FLOAT)
        return b.node("Sub", [b.const(1.0 - float(self.quantile)), at_or_below])


class TweedieLearningLoss(BaseLearningLoss):
    """Half the Tweedie unit deviance of power p with a log link, the score ``s`` being the linear predictor
    (mean ``exp(s)``), as TweedieRegressor(link='log') and scikit-learn's HalfTweedieLoss plus its constant:
    ``l = y ** (2-p) / ((1-p)(2-p)) - y * exp((1-p) s) / (1-p) + exp((2-p) s) / (2-p)``; for p = 1 (Poisson)
    ``y log y - y + exp(s) - y s``, for p = 2 (Gamma) ``s - log y + y exp(-s) - 1``. It is 0 where
    ``exp(s) = y``. Derivative ``exp((2-p) s) - y * exp((1-p) s)``. Labels must be >= 0 (> 0 for p >= 2)."""

    names = ("tweedie",)

    def __init__(self, power: float = 1.5):
        self.power = power

    def check(self) -> None:
        import math

        p = self.power
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or 0 < p < 1:
            raise ValueError(f"{type(self).__name__}: power={p!r} must be <= 0 or >= 1 (finite)")

    def _scaled_exp(self, b, pred, k: float) -> str:
        return b.node("Exp", [b.node("Mul", [pred, b.const(k)])]) if k != 1.0 else b.node("Exp", [pred])

    def _per_sample(self, b, pred, label):
        p = float(self.power)
        if p == 1.0:
            y_log_y = b.node("Mul", [label, b.node("Log", [b.node("Max", [label, b.const(1e-30)])])])
            return b.node("Sub", [b.node("Add", [b.node("Sub", [y_log_y, label]), b.node("Exp", [pred])]),
                                  b.node("Mul", [label, pred])])
        if p == 2.0:
            term = b.node("Mul", [label, b.node("Exp", [b.node("Neg", [pred])])])
            return b.node("Sub", [b.node("Add", [pred, term]), b.node("Add", [b.node("Log", [label]), b.const(1.0)])])
        constant = b.node("Mul", [b.node("Pow", [label, b.const(2.0 - p)]), b.const(1.0 / ((1.0 - p) * (2.0 - p)))])
        first = b.node("Mul", [b.node("Mul", [label, self._scaled_exp(b, pred, 1.0 - p)]), b.const(1.0 / (1.0 - p))])
        second = b.node("Mul", [self._scaled_exp(b, pred, 2.0 - p), b.const(1.0 / (2.0 - p))])
        return b.node("Add", [b.node("Sub", [constant, first]), second])

    def _derivative(self, b, pred, label):
        p = float(self.power)
        low = label if p == 1.0 else b.node("Mul", [label, self._scaled_exp(b, pred, 1.0 - p)])
        high = b.const(1.0) if p == 2.0 else self._scaled_exp(b, pred, 2.0 - p)
        return b.node("Sub", [high, low])


class PoissonLearningLoss(TweedieLearningLoss):
    """Half the Poisson deviance, log link (PoissonRegressor): the Tweedie loss at power 1."""

    names = ("poisson",)
    power = 1.0

    def __init__(self):
        pass


class GammaLearningLoss(TweedieLearningLoss):
    """Half the Gamma deviance, log link (GammaRegressor): the Tweedie loss at power 2."""

    names = ("gamma",)
    power = 2.0

    def __init__(self):
        pass
