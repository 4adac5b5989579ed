"""Forward-backward training: onnxruntime computes the forward and backward passes of a prediction graph,
small ONNX graphs of ortflow compute the loss gradient and the weight update.

Each family (losses, penalties, learning rates) is selectable by instance or by short name through
:func:`select`; a user subclass declaring ``names`` joins the registry.
"""

from .forward_backward import OrtGradientForwardBackward, select
from .learning_rates import BaseLearningRate, LearningRateAdam, LearningRateSGD, LearningRateSGDNesterov
from .losses import (
    AbsoluteLearningLoss,
    BaseLearningLoss,
    ElasticLearningLoss,
    NegLogLearningLoss,
    SquareLearningLoss,
)
from .optimizer import OrtGradientForwardBackwardOptimizer
from .penalties import BaseLearningPenalty, ElasticLearningPenalty, NoLearningPenalty

__all__ = [
    "AbsoluteLearningLoss",
    "BaseLearningLoss",
    "BaseLearningPenalty",
    "BaseLearningRate",
    "ElasticLearningLoss",
    "ElasticLearningPenalty",
    "LearningRateAdam",
    "LearningRateSGD",
    "LearningRateSGDNesterov",
    "NegLogLearningLoss",
    "NoLearningPenalty",
    "OrtGradientForwardBackward",
    "OrtGradientForwardBackwardOptimizer",
    "SquareLearningLoss",
    "select",
]
