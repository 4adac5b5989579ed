"""Learning penalties on the trained weights: a value added to the loss and its gradient added to the weights'.

A penalty class writes its rule once, against a small arithmetic interface ``ops`` (``add``, ``mul``, ``abs``,
``sign``, ``sum``, ``const``): :meth:`~BaseLearningPenalty._value` (the penalty of one weight tensor) and
:meth:`~BaseLearningPenalty._gradient` (the loss gradient plus the penalty's). Every trainer uses that one rule:

- forward-backward training: the update graph adds the gradient (:meth:`BaseLearningPenalty.add_gradient`, ``ops``
  writing ONNX nodes, :class:`GraphOps`) and outputs the value;
- full training: :func:`ortflow.add_loss_output` writes the value into the loss graph
  (:meth:`BaseLearningPenalty.add_value`), whose gradient the step graph differentiates;
- the torch trainer: :meth:`BaseLearningPenalty.value` and :meth:`BaseLearningPenalty.gradient` on torch tensors
  (:class:`ArrayOps`), the same arithmetic on numpy arrays for a reference.

``ElasticLearningPenalty(l1, l2)`` adds ``l1 * sum|w| + l2 * sum(w ** 2)`` per penalized weight, its gradient
``l1 * sign(w) + 2 * l2 * w``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx

from ..graph.builder import DEFAULT_OPSET, GraphBuilder
from ..registry import Parametrized, Registered
from ..runtime.sessions import OnnxFunction, OrtValue
from ..runtime.validation import check_non_negative


class GraphOps:
    """The penalties' arithmetic as ONNX nodes of a :class:`~ortflow.graph.builder.GraphBuilder`."""

    def __init__(self, b: GraphBuilder):
        self._b = b

    def const(self, value: float) -> str:
        return self._b.const(value)

    def add(self, a, b):
        return self._b.node("Add", [a, b])

    def mul(self, a, b):
        return self._b.node("Mul", [a, b])

    def abs(self, a):
        return self._b.node("Abs", [a])

    def sign(self, a):
        return self._b.node("Sign", [a])

    def sum(self, a):
        """The sum of every element of ``a``: a scalar."""
        return self._b.node("ReduceSum", [a], keepdims=0)

    def add_all(self, terms: Sequence) -> str:
        return self._b.add_all(list(terms))


class ArrayOps:
    """The same arithmetic on torch tensors or numpy arrays (scalars in float32, as in the graphs)."""

    add, mul = (staticmethod(f) for f in (lambda a, b: a + b, lambda a, b: a * b))

    @staticmethod
    def const(value: float):
        return np.float32(value)

    @staticmethod
    def abs(a):
        return a.abs() if hasattr(a, "abs") else np.abs(a)  # a torch tensor, else numpy

    @staticmethod
    def sign(a):
        return a.sign() if hasattr(a, "sign") else np.sign(a)

    @staticmethod
    def sum(a):
        return a.sum()

    @staticmethod
    def add_all(terms: Sequence):
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total


class BaseLearningPenalty(Registered, Parametrized):
    """A penalty: its rule is :meth:`_value` and :meth:`_gradient` in ``ops``' arithmetic (a subclass writes those
    two); :meth:`add_value` / :meth:`add_gradient` write them into a graph under construction (the learning rates
    fuse them into their update graph), :meth:`value` / :meth:`gradient` compute them on tensors,
    :meth:`build_onnx_function` gives standalone graphs."""

    kind = "penalty"

    def penalizes(self, name: str) -> bool:
        """Whether the weight ``name`` is penalized."""
        weights = getattr(self, "weights", None)
        return weights is None or name in weights

    def is_null(self) -> bool:
        """True when the penalty adds nothing: its class writes no rule (a subclass with settings that can turn it
        off says when)."""
        return type(self)._value is BaseLearningPenalty._value

    def check(self) -> None:
        """Raise ValueError on an invalid hyper-parameter."""

    def _value(self, ops, weight):
        """The penalty of the weight tensor ``weight`` (a scalar), or None for none."""
        return None

    def _gradient(self, ops, weight, grad):
        """``grad`` plus the penalty's gradient at ``weight``."""
        return grad

    def add_value(self, b: GraphBuilder, weight: str) -> str | None:
        """Name of the penalty value of ``weight`` (a scalar), or None for no penalty."""
        return self._value(GraphOps(b), weight)

    def add_gradient(self, b: GraphBuilder, weight: str, grad: str) -> str:
        """Name of ``grad`` plus the penalty's gradient at ``weight``."""
        return self._gradient(GraphOps(b), weight, grad)

    def value(self, weights: Iterable) -> Any:
        """The summed penalty of ``weights`` (torch tensors or numpy arrays, all penalized); 0.0 for none."""
        terms = [t for t in (self._value(ArrayOps, w) for w in weights) if t is not None]
        return ArrayOps.add_all(terms) if terms else 0.0

    def gradient(self, weight, grad) -> Any:
        """``grad`` plus the penalty's gradient at ``weight`` (a torch tensor or a numpy array)."""
        return self._gradient(ArrayOps, weight, grad)

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

    def _value(self, ops, weight):
        terms = []
        if self.l1:
            terms.append(ops.mul(ops.sum(ops.abs(weight)), ops.const(self.l1)))
        if self.l2:
            terms.append(ops.mul(ops.sum(ops.mul(weight, weight)), ops.const(self.l2)))
        return ops.add_all(terms) if terms else None

    def _gradient(self, ops, weight, grad):
        if self.l1:
            grad = ops.add(grad, ops.mul(ops.sign(weight), ops.const(self.l1)))
        if self.l2:
            grad = ops.add(grad, ops.mul(weight, ops.const(2.0 * self.l2)))
        return grad
