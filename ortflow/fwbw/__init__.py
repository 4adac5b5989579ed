"""Forward-backward training: onnxruntime computes the forward and backward passes of a prediction graph,
small ONNX graphs of ortflow compute the loss gradient and the weight update.

The loss, penalty and learning-rate families live in :mod:`ortflow.losses`, :mod:`ortflow.penalties` and
:mod:`ortflow.learning_rates` (every trainer uses them); they are re-exported here, where onnxcustom's users look (every optimizer class:
``ortflow.registry.names('optimizer')`` lists their names).
"""

from ..learning_rates import (
    BaseLearningRate,
    LearningRateAdagrad,
    LearningRateAdam,
    LearningRateAdamW,
    LearningRateRMSProp,
    LearningRateSGD,
    LearningRateSGDNesterov,
)
from ..losses import (
    AbsoluteLearningLoss,
    BaseLearningLoss,
    ElasticLearningLoss,
    NegLogLearningLoss,
    SquareLearningLoss,
)
from ..penalties import BaseLearningPenalty, ElasticLearningPenalty, NoLearningPenalty
from ..registry import select
from .forward_backward import OrtGradientForwardBackward
from .optimizer import OrtGradientForwardBackwardOptimizer

__all__ = [
    "AbsoluteLearningLoss",
    "BaseLearningLoss",
    "BaseLearningPenalty",
    "BaseLearningRate",
    "ElasticLearningLoss",
    "ElasticLearningPenalty",
    "LearningRateAdagrad",
    "LearningRateAdam",
    "LearningRateAdamW",
    "LearningRateRMSProp",
    "LearningRateSGD",
    "LearningRateSGDNesterov",
    "NegLogLearningLoss",
    "NoLearningPenalty",
    "OrtGradientForwardBackward",
    "OrtGradientForwardBackwardOptimizer",
    "SquareLearningLoss",
    "select",
]
