"""Learning penalties on the trained weights: a value added to the loss and its gradient added to the weights'.

``ElasticLearningPenalty(l1, l2)`` adds ``l1 * sum|w| + l2 * sum(w ** 2)`` per penalized weight; its gradient
``l1 * sign(w) + 2 * l2 * w`` joins the loss gradient before the learning-rate update (forward-backward
training). :func:`ortflow.add_loss_output` writes the same value nodes into the loss graph (full training).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx

from .onnx_builder import DEFAULT_OPSET, GraphBuilder
from .registry import Parametrized, Registered
from .runtime import OnnxFunction, OrtValue
from .validation import check_non_negative


class BaseLearningPenalty(Registered, Parametrized):
    """A penalty: :meth:`add_value` / :meth:`add_gradient` write its nodes into a graph under construction (the
    learning rates fuse them into their update graph); :meth:`build_onnx_function` gives standalone graphs."""

    kind = "penalty"

    def penalizes(self, name: str) -> bool:
        """Whether the weight ``name`` is penalized."""
        weights = getattr(self, "weights", None)
        return weights is None or name in weights

    def is_null(self) -> bool:
        """True when the penalty adds nothing (no node is written)."""
        return True

    def check(self) -> None:
        """Raise ValueError on an invalid hyper-parameter."""

    def add_value(self, b: GraphBuilder, weight: str) -> str | None:
        """Name of the penalty value of ``weight`` (a scalar), or None for no penalty."""
        return None

    def add_gradient(self, b: GraphBuilder, weight: str, grad: str) -> str:
        """Name of ``grad`` plus the penalty's gradient at ``weight``."""
        return grad

    def build_onnx_function(self, opset: int = DEFAULT_OPSET, device: str = "cpu",
                            n_tensors: int = 1) -> tuple[onnx.ModelProto, onnx.ModelProto]:
        """(value graph: inputs ``weight_0..weight_{n-1}`` -> ``loss``, the summed penalty; gradient graph:
        inputs ``grad``, ``weight`` -> ``new_grad``). ``device`` does not change the graphs."""
        self.check()
        b = GraphBuilder(prefix="penalty")
        terms = [self.add_value(b, b.input(f"weight_{i}")) for i in range(n_tensors)]
        b.output(b.add_all([t for t in terms if t is not None]), "loss", [])
        value = b.model(opset, name=f"{type(self).__name__}_value")
        b = GraphBuilder(prefix="penalty_grad")
        grad, weight = b.input("grad"), b.input("weight")
        new = self.add_gradient(b, weight, grad)
        b.output(new if new != grad else b.node("Identity", [grad]), "new_grad")
        return value, b.model(opset, name=f"{type(self).__name__}_gradient")

    def _functions(self, device: str, n_tensors: int) -> tuple[OnnxFunction, OnnxFunction]:
        cache = self.__dict__.setdefault("_cache", {})
        if (device, n_tensors) not in cache:
            value, grad = self.build_onnx_function(DEFAULT_OPSET, device, n_tensors)
            cache[device, n_tensors] = OnnxFunction(value, device), OnnxFunction(grad, device)
        return cache[device, n_tensors]

    def penalty_loss(self, device: str, *weights: Any) -> float:
        """The penalty of ``weights`` (OrtValues or arrays), all penalized."""
        value, _ = self._functions(device, len(weights))
        return float(value.run(*weights)[0].numpy())

    def penalty_gradient(self, device: str, grad: Any, weight: Any) -> OrtValue:
        """``grad`` plus the penalty's gradient at ``weight``."""
        _, function = self._functions(device, 1)
        return function.run(grad, weight)[0]

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_cache", None)
        return state


class NoLearningPenalty(BaseLearningPenalty):
    """No penalty."""

    names = (None, "none")

    def __init__(self):
        pass


class ElasticLearningPenalty(BaseLearningPenalty):
    """``l1 * sum|w| + l2 * sum(w ** 2)`` on each weight named in ``weights`` (None: every trained weight)."""

    names = ("elastic", "l1l2")

    def __init__(self, l1: float = 0.5, l2: float = 0.5, weights: Sequence[str] | None = None):
        self.l1 = l1
        self.l2 = l2
        self.weights = weights

    def is_null(self) -> bool:
        return not (self.l1 or self.l2)

    def check(self) -> None:
        check_non_negative("l1", self.l1, "the penalty would reward large weights")
        check_non_negative("l2", self.l2, "the penalty would reward large weights")

    def add_value(self, b, weight):
        terms = []
        if self.l1:
            terms.append(b.node("Mul", [b.node("ReduceSum", [b.node("Abs", [weight])], keepdims=0), b.const(self.l1)]))
        if self.l2:
            square = b.node("Mul", [weight, weight])
            terms.append(b.node("Mul", [b.node("ReduceSum", [square], keepdims=0), b.const(self.l2)]))
        return b.add_all(terms) if terms else None

    def add_gradient(self, b, weight, grad):
        if self.l1:
            grad = b.node("Add", [grad, b.node("Mul", [b.node("Sign", [weight]), b.const(self.l1)])])
        if self.l2:
            grad = b.node("Add", [grad, b.node("Mul", [weight, b.const(2.0 * self.l2)])])
        return grad

