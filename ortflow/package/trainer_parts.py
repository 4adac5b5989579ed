"""Reading an ortflow trainer into what a training package is made of: the trainer's own
:meth:`~ortflow.trainers.base.BaseTrainer.training_problem`, a :class:`ortflow.trainers.problem.TrainingProblem` (its loss graph,
weights, optimizer slots, optimizer, schedule, progress and batch size); no trainer's private attribute is read."""

from __future__ import annotations

from ..exceptions import TrainingPackageError
from ..trainers.problem import TrainingProblem

#: what a package is made of, read from an ortflow trainer (its earlier name)
_Trainer = TrainingProblem


def _read_trainer(estimator) -> TrainingProblem:
    """What ``estimator`` trains (:meth:`ortflow.trainers.base.BaseTrainer.training_problem`)."""
    if not callable(getattr(estimator, "training_problem", None)):
        raise TrainingPackageError(f"export_training_package takes an OrtGradientOptimizer (or another ortflow "
                                   f"trainer: OrtGradientForwardBackwardOptimizer, TorchTrainer), not "
                                   f"{type(estimator).__name__}")
    return estimator.training_problem()
