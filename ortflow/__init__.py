"""ortflow: train ONNX graphs with onnxruntime (the plain build, or onnxruntime-training).

The names below are loaded on first use (PEP 562): ``import ortflow`` alone imports neither onnxruntime nor
scikit-learn (over a second of start-up on their own), the first ``ortflow.OrtGradientOptimizer`` does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

#: public name -> the submodule that defines it: the one list of the public names (``__all__`` is its keys; the
#: ``TYPE_CHECKING`` imports repeat it for static analysis, and tests/test_startup.py checks that they match it)
_EXPORTS = {
    **dict.fromkeys(["backend", "device_info"], "_ort"),
    **dict.fromkeys(["add_loss_output"], "objectives.add_loss"),
    **dict.fromkeys(["onnx_derivative"], "autodiff"),
    **dict.fromkeys(["BaseTrainer"], "trainers.base"),
    **dict.fromkeys(["Callback", "Checkpoint", "EarlyStopping", "ProgressBar"], "trainers.callbacks"),
    **dict.fromkeys(["to_onnx"], "convert.sklearn"),
    **dict.fromkeys(["CheckpointError", "ConvergenceError", "DeviceError", "NotDifferentiableError",
                     "OrtflowError", "TrainingPackageError", "UnsafePathError", "UnsupportedModelError"], "exceptions"),
    **dict.fromkeys(["OrtGradientOptimizer"], "trainers.full"),
    **dict.fromkeys(["OrtGradientForwardBackward"], "engines.forward_backward"),
    **dict.fromkeys(["OrtGradientForwardBackwardOptimizer"], "trainers.fwbw"),
    **dict.fromkeys(["get_initializers", "load_model", "replace_initializers", "trainable_initializers"], "graph.editing"),
    **dict.fromkeys(["BaseLearningRate", "LearningRateAdagrad", "LearningRateAdam", "LearningRateAdamW",
                     "LearningRateRMSProp", "LearningRateSGD", "LearningRateSGDNesterov"], "optimizers.learning_rates"),
    **dict.fromkeys(["AbsoluteLearningLoss", "BaseLearningLoss", "ElasticLearningLoss", "NegLogLearningLoss",
                     "SquareLearningLoss"], "objectives.losses"),
    **dict.fromkeys(["make_trainable"], "convert.ml_op_rewrites"),
    **dict.fromkeys(["export_training_package"], "package"),
    **dict.fromkeys(["load_training_state"], "package"),
    **dict.fromkeys(["BaseLearningPenalty", "ElasticLearningPenalty", "NoLearningPenalty"], "objectives.penalties"),
    **dict.fromkeys(["TorchTrainer"], "trainers.torch_trainer"),
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # what static analysis sees; at run time __getattr__ loads each name
    from ._ort import backend, device_info
    from .objectives.add_loss import add_loss_output
    from .autodiff import onnx_derivative
    from .trainers.base import BaseTrainer
    from .trainers.callbacks import Callback, Checkpoint, EarlyStopping, ProgressBar
    from .convert.sklearn import to_onnx
    from .exceptions import (CheckpointError, ConvergenceError, DeviceError, NotDifferentiableError, OrtflowError,
                             TrainingPackageError, UnsafePathError, UnsupportedModelError)
    from .trainers.full import OrtGradientOptimizer
    from .engines.forward_backward import OrtGradientForwardBackward
    from .trainers.fwbw import OrtGradientForwardBackwardOptimizer
    from .graph.editing import get_initializers, load_model, replace_initializers, trainable_initializers
    from .optimizers.learning_rates import (BaseLearningRate, LearningRateAdagrad, LearningRateAdam, LearningRateAdamW,
                                            LearningRateRMSProp, LearningRateSGD, LearningRateSGDNesterov)
    from .objectives.losses import (AbsoluteLearningLoss, BaseLearningLoss, ElasticLearningLoss, NegLogLearningLoss,
                                    SquareLearningLoss)
    from .convert.ml_op_rewrites import make_trainable
    from .package import export_training_package, load_training_state
    from .objectives.penalties import BaseLearningPenalty, ElasticLearningPenalty, NoLearningPenalty
    from .trainers.torch_trainer import TorchTrainer


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
