"""ortflow: train ONNX graphs with onnxruntime (the plain build, or onnxruntime-training)."""

from ._ort import backend

from .autodiff import onnx_derivative
from .base import BaseTrainer
from .callbacks import Callback, Checkpoint, EarlyStopping, ProgressBar
from .convert import to_onnx
from .exceptions import (
    ConvergenceError,
    DeviceError,
    NotDifferentiableError,
    OrtflowError,
    UnsafePathError,
    UnsupportedModelError,
)
from .full import OrtGradientOptimizer
from .fwbw import (
    AbsoluteLearningLoss,
    BaseLearningLoss,
    BaseLearningPenalty,
    BaseLearningRate,
    ElasticLearningLoss,
    ElasticLearningPenalty,
    LearningRateAdam,
    LearningRateAdamW,
    LearningRateSGD,
    LearningRateSGDNesterov,
    NegLogLearningLoss,
    NoLearningPenalty,
    OrtGradientForwardBackward,
    OrtGradientForwardBackwardOptimizer,
    SquareLearningLoss,
)
from .graph import get_initializers, load_model, replace_initializers, trainable_initializers
from .add_loss import add_loss_output
from .mlops import make_trainable

__version__ = "0.1.0"

__all__ = [
    "AbsoluteLearningLoss",
    "BaseLearningLoss",
    "BaseLearningPenalty",
    "BaseLearningRate",
    "BaseTrainer",
    "Callback",
    "Checkpoint",
    "ConvergenceError",
    "DeviceError",
    "EarlyStopping",
    "ElasticLearningLoss",
    "ElasticLearningPenalty",
    "LearningRateAdam",
    "LearningRateAdamW",
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
    "UnsafePathError",
    "UnsupportedModelError",
    "add_loss_output",
    "backend",
    "get_initializers",
    "load_model",
    "onnx_derivative",
    "make_trainable",
    "replace_initializers",
    "to_onnx",
    "trainable_initializers",
]
