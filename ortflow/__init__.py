"""ortflow: train ONNX graphs with onnxruntime (the plain build, or onnxruntime-training).

The names below are loaded on first use (PEP 562): ``import ortflow`` alone imports neither onnxruntime nor
scikit-learn (over a second of start-up on their own), the first ``ortflow.OrtGradientOptimizer`` does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

#: public name -> the submodule that defines it
_EXPORTS = {
    **dict.fromkeys(["backend", "device_info"], "_ort"),
    **dict.fromkeys(["onnx_derivative"], "autodiff"),
    **dict.fromkeys(["BaseTrainer"], "base"),
    **dict.fromkeys(["Callback", "Checkpoint", "EarlyStopping", "ProgressBar"], "callbacks"),
    **dict.fromkeys(["to_onnx"], "convert"),
    **dict.fromkeys(["CheckpointError", "ConvergenceError", "DeviceError", "NotDifferentiableError",
                     "OrtflowError", "UnsafePathError", "UnsupportedModelError"], "exceptions"),
    **dict.fromkeys(["OrtGradientOptimizer"], "full"),
    **dict.fromkeys(["TorchTrainer"], "torch_trainer"),
    **dict.fromkeys(["LearningRateRMSProp"], "learning_rates"),
    **dict.fromkeys(["AbsoluteLearningLoss", "BaseLearningLoss", "BaseLearningPenalty", "BaseLearningRate",
                     "ElasticLearningLoss", "ElasticLearningPenalty", "LearningRateAdam", "LearningRateAdamW",
                     "LearningRateSGD", "LearningRateSGDNesterov", "NegLogLearningLoss", "NoLearningPenalty",
                     "OrtGradientForwardBackward", "OrtGradientForwardBackwardOptimizer", "SquareLearningLoss"],
                    "fwbw"),
    **dict.fromkeys(["get_initializers", "load_model", "replace_initializers", "trainable_initializers"], "graph"),
    **dict.fromkeys(["add_loss_output"], "add_loss"),
    **dict.fromkeys(["make_trainable"], "ml_op_rewrites"),
}

if TYPE_CHECKING:  # what static analysis sees; at run time __getattr__ loads each name
    from ._ort import backend, device_info
    from .add_loss import add_loss_output
    from .autodiff import onnx_derivative
    from .base import BaseTrainer
    from .callbacks import Callback, Checkpoint, EarlyStopping, ProgressBar
    from .convert import to_onnx
    from .exceptions import (CheckpointError, ConvergenceError, DeviceError, NotDifferentiableError, OrtflowError,
                             UnsafePathError, UnsupportedModelError)
    from .full import OrtGradientOptimizer
    from .torch_trainer import TorchTrainer
    from .learning_rates import LearningRateRMSProp
    from .fwbw import (AbsoluteLearningLoss, BaseLearningLoss, BaseLearningPenalty, BaseLearningRate,
                       ElasticLearningLoss, ElasticLearningPenalty, LearningRateAdam, LearningRateAdamW,
                       LearningRateSGD, LearningRateSGDNesterov, NegLogLearningLoss, NoLearningPenalty,
                       OrtGradientForwardBackward, OrtGradientForwardBackwardOptimizer, SquareLearningLoss)
    from .graph import get_initializers, load_model, replace_initializers, trainable_initializers
    from .ml_op_rewrites import make_trainable


def __getattr__(name: str):
    """A public name (imported from its submodule on first use, then cached here), or a submodule."""
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    else:
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__version__ = "0.1.0"

__all__ = [
    "AbsoluteLearningLoss",
    "BaseLearningLoss",
    "BaseLearningPenalty",
    "BaseLearningRate",
    "BaseTrainer",
    "Callback",
    "Checkpoint",
    "CheckpointError",
    "ConvergenceError",
    "DeviceError",
    "EarlyStopping",
    "ElasticLearningLoss",
    "ElasticLearningPenalty",
    "LearningRateAdam",
    "LearningRateAdamW",
    "LearningRateRMSProp",
    "LearningRateSGD",
    "LearningRateSGDNesterov",
    "NegLogLearningLoss",
    "NoLearningPenalty",
    "NotDifferentiableError",
    "OrtGradientForwardBackward",
    "OrtGradientForwardBackwardOptimizer",
    "OrtGradientOptimizer",
    "OrtflowError",
    "ProgressBar",
    "SquareLearningLoss",
    "TorchTrainer",
    "UnsafePathError",
    "UnsupportedModelError",
    "add_loss_output",
    "backend",
    "device_info",
    "get_initializers",
    "load_model",
    "onnx_derivative",
    "make_trainable",
    "replace_initializers",
    "to_onnx",
    "trainable_initializers",
]
