"""The trainers' parameters, declared once: name, default, check and meaning.

``BaseTrainer`` takes its ``__init__`` from these tables (it stores every argument untouched, as scikit-learn
requires) and checks them all in ``fit`` through :func:`check_parameters`. A parameter shared by both trainers has
one name, one default and one meaning.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Callable, List, Optional, Union

from .callbacks import Callback
from ..optimizers.schedules import SCHEDULES
from ..runtime.validation import (check_bool, check_choice, check_device, check_finite, check_non_negative,
                                  check_positive_float, check_positive_int, check_precision)

REQUIRED = inspect.Parameter.empty
#: who builds the gradient graphs, with one meaning in every trainer that takes ``gradients``: ``'ortflow'``
#: (its own standard-ONNX graphs, any onnxruntime build), ``'onnxruntime'`` (onnxruntime-training's, training build
#: only) or ``'auto'``: ortflow's, and onnxruntime's on the training build for a graph holding an op outside
#: ortflow's gradient rules (on the plain build such a graph is refused naming the op)
GRADIENTS = ("auto", "ortflow", "onnxruntime")


@dataclass(frozen=True)
class Param:
    """One constructor parameter: ``check(name, value)`` raises on a bad value (None: anything goes). ``annotation``:
    the type of the values a config may give it (the pipelines' schema, :mod:`pipelines.base.schema`, is generated
    from these tables), when it is not the default's type."""

    name: str
    default: Any
    check: Optional[Callable[[str, Any], Any]]
    doc: str
    annotation: Any = None

    @property
    def type(self) -> Any:
        """The type of the values it takes: ``annotation``, else the default's type."""
        return self.annotation if self.annotation is not None else type(self.default)


def _optional(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    return lambda name, value: None if value is None else check(name, value)


def _names(name: str, value: Any) -> None:
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{name}={value!r} must be a list of names (initializers)")


def _learning_rate(name: str, value: Any) -> None:
    from ..optimizers.learning_rates import BaseLearningRate
    from ..registry import lookup, names

    if isinstance(value, BaseLearningRate):
        value.check()
    elif isinstance(value, str):
        if lookup("optimizer", value) is None:
            raise ValueError(f"{name}={value!r} is not a learning rate; use a positive float, one of "
                             f"{names('optimizer')} or a BaseLearningRate instance")
    else:
        check_positive_float(name, value)


def _family(kind: str, base: str) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        from ..registry import select

        select(kind, value, name).check()

    check.__doc__ = f"a registered {kind} name or a {base} instance"
    return check


def _validation_every(name: str, value: Any) -> None:
    if isinstance(value, Real) and not isinstance(value, (bool, Integral)):
        if not 0.0 < value < 1.0:
            raise ValueError(f"{name}={value!r}: a float is a fraction of max_iter and must be in (0, 1); "
                             "an int N validates every N epochs")
        return
    check_positive_int(name, value)


def _fraction(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 < value < 1.0:
        raise ValueError(f"{name}={value!r} must be in (0, 1)")


def _non_negative_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise ValueError(f"{name}={value!r} must be an integer >= 0")


def _callbacks(name: str, value: Any) -> None:
    for cb in value:
        if not isinstance(cb, Callback):
            raise TypeError(f"{name} holds {cb!r}, which is not an ortflow.trainers.callbacks.Callback")


def _string(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name}={value!r} must be a non-empty string")


def _output(name: str, value: Any) -> None:
    if not isinstance(value, (str, Integral)) or isinstance(value, bool):
        raise TypeError(f"{name}={value!r} must be an output name, an output position or None")


def _random_state(name: str, value: Any) -> None:
    """What scikit-learn's ``check_random_state`` takes (None, an int in [0, 2**32), a numpy RandomState), checked
    without importing scikit-learn (seconds of imports; the pipelines check settings before any run)."""
    import numpy as np

    if value is None or isinstance(value, np.random.RandomState):
        return
    if isinstance(value, Integral) and not isinstance(value, bool) and 0 <= value < 2**32:
        return
    raise ValueError(f"{name}={value!r} must be None, an int or a numpy RandomState")


MODEL = Param("model_onnx", REQUIRED, None, "the graph: a ModelProto, its bytes or a file path")
WEIGHTS = Param("weights_to_train", None, _optional(_names),
                "initializers to train, names or glob patterns (``head.*``); None: every float initializer the trained "
                "output depends on. Neither None nor a pattern selects a BatchNormalization's running mean and "
                "variance (statistics, kept as they are); a name does", Optional[List[str]])

def _shuffle(name: str, value):
    if isinstance(value, str) and value == "portable":
        return value
    try:
        return check_bool(name, value)
    except TypeError:
        raise TypeError(f"{name}={value!r} must be True, False or 'portable'") from None


SHARED = (
    Param("max_iter", 100, check_positive_int, "number of epochs"),
    Param("batch_size", 10, check_positive_int, "samples per batch (at most the number of training samples)"),
    Param("learning_rate", 0.01, _learning_rate,
          "a positive float (SGD at that rate, following lr_schedule and power_t), an optimizer's registered name "
          "(ortflow.registry.names('optimizer'): that class with its defaults) or a BaseLearningRate instance"),
    Param("lr_schedule", "constant", lambda n, v: check_choice(n, v, SCHEDULES),
          "schedule of a float learning_rate: 'constant', 'invscaling', 'optimal' (onnxcustom's, first rate eta0) or "
          "'optimal_sklearn' (scikit-learn's)"),
    Param("power_t", 0.25, check_finite, "exponent of the 'invscaling' schedule"),
    Param("device", "cpu", lambda n, v: check_device(v), "'cpu', 'cuda', 'cuda:N' or 'auto'"),
    Param("precision", "fp32", check_precision,
          "float32 matrix products on CUDA: 'fp32' exact (PyTorch's default) or 'tf32' (TensorFloat-32 inputs, "
          "faster on Ampere and later GPUs, about 1e-3 relative error); applied to every session of the trainer "
          "(the CUDA provider's use_tf32), no effect on CPU"),
    Param("warm_start", False, check_bool, "a new fit continues from the current weights and optimizer state"),
    Param("verbose", 0, _non_negative_int, "1 or more: a progress bar over epochs"),
    Param("validation_every", 1, _validation_every,
          "validate every N epochs (an int), or every fraction of max_iter (a float in (0, 1))", Union[int, float]),
    Param("validation_fraction", None, _optional(_fraction),
          "part of the training data held out for validation when fit gets no validation_data", Optional[float]),
    Param("early_stopping", False, check_bool, "stop when the validation loss stops improving"),
    Param("n_iter_no_change", 10, check_positive_int, "early stopping's patience, in epochs"),
    Param("tol", 1e-4, check_non_negative, "early stopping's minimum improvement"),
    Param("shuffle", True, _shuffle,
          "shuffle the samples before every epoch: True (numpy's generator), False, or 'portable' (the generator "
          "training packages use, ortflow.data.shuffle: with an int random_state, the batches another runtime draws "
          "from that seed)", Union[bool, str]),
    Param("random_state", None, _random_state, "seed of the shuffling and of the validation split", Optional[int]),
    Param("callbacks", None, _optional(_callbacks), "ortflow.Callback objects called after every epoch"),
    Param("exc", True, check_bool,
          "True: a non-finite loss raises ConvergenceError; False: warn and keep the last finite weights"),
    Param("n_threads", None, _optional(check_positive_int),
          "intra-op threads of onnxruntime; None: chosen from a batch's work (one thread for small batches through "
          "small graphs, all cores otherwise), the choice in ``n_threads_``", Optional[int]),
    Param("spinning", None, _optional(check_bool),
          "whether onnxruntime's idle intra-op threads spin waiting for work (True) or sleep (False); None: they "
          "spin in memory and sleep in a streamed fit, whose reader thread needs a core (the numbers are the same "
          "either way; TorchTrainer's layer sleeps unless True)", Optional[bool]),
    Param("enable_logging", False, check_bool,
          "log every epoch (INFO) and every batch loss (DEBUG) to the 'ortflow' logger"),
    Param("prefetch_depth", 2, check_positive_int,
          "chunks of a streamed source (ortflow.data.sources) read and converted ahead on a background thread"),
)

def _gradients(name: str, value: Any) -> None:
    check_choice(name, value, GRADIENTS)
    if value == "onnxruntime":
        from .._ort import require_training

        require_training(f"{name}='onnxruntime'")


GRADIENTS_PARAM = Param("gradients", "auto", _gradients,
                        "who builds the gradient graphs: 'ortflow' (its own, any onnxruntime), 'onnxruntime' "
                        "(onnxruntime-training's, training build only) or 'auto' (ortflow's, onnxruntime's on the "
                        "training build for an op outside ortflow's gradient rules); see GRADIENTS")

FULL = (
    Param("loss_output_name", "loss", _string, "the graph output holding the loss (add_loss_output's loss_name)"),
    Param("label_name", "label", _string, "the graph input taking the labels"),
    Param("sample_weight_name", "weight", _string, "the graph input taking sample weights, when it has one"),
    GRADIENTS_PARAM,
)

#: the parameters of the trainers that add the loss to a prediction graph themselves (forward-backward, torch)
LOSS = (
    Param("learning_loss", None, _optional(_family("loss", "BaseLearningLoss")),
          "the loss: a registered name (ortflow.registry.names('loss')), a BaseLearningLoss instance, or None: the "
          "model's own loss, the one add_loss_output picks for the full trainer (ortflow.objectives.estimator_loss: log loss "
          "for a classifier, the estimator's loss and settings; squared_error for a graph without a record)"),
    Param("learning_penalty", None, _family("penalty", "BaseLearningPenalty"),
          "a penalty on the weights: a registered name (ortflow.registry.names('penalty')), a BaseLearningPenalty "
          "instance, or None: with learning_loss None the estimator's own penalty (as add_loss_output adds it "
          "without n_samples), else none"),
    Param("output_name", None, _optional(_output),
          "the trained output; None: the only output, or raw_score when present"),
    Param("weight_name", None, _optional(_string), "name of the sample-weight input of the loss graph"),
)

FWBW = (*LOSS, GRADIENTS_PARAM)


def _cpu(name: str, value: Any) -> None:
    if value != "cpu":
        raise ValueError(f"{name}={value!r}: TorchTrainer runs on 'cpu' only; use OrtGradientOptimizer or "
                         "OrtGradientForwardBackwardOptimizer for another device")


#: the torch trainer (:class:`ortflow.trainers.torch_trainer.TorchTrainer`): the loss parameters, and the shared ones with
#: ``device`` limited to 'cpu'; no ``gradients``: the torch layer (:class:`ortflow.torch.OnnxModule`) builds them
#: as ``gradients='auto'`` does
TORCH = (*LOSS, *(Param("device", "cpu", _cpu, "'cpu' only") if p.name == "device" else p for p in SHARED))


#: every trainer's table by class name: the pipelines check a config against them without importing the trainers
#: (nor torch)
TRAINERS = {
    "OrtGradientOptimizer": (MODEL, WEIGHTS, *FULL, *SHARED),
    "OrtGradientForwardBackwardOptimizer": (MODEL, WEIGHTS, *FWBW, *SHARED),
    "TorchTrainer": (MODEL, WEIGHTS, *TORCH),
}


def init_from(params: tuple[Param, ...]) -> Callable:
    """An ``__init__`` storing each parameter of ``params`` untouched, with the matching signature."""
    signature = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=p.default) for p in params]
    )

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        for name, value in list(bound.arguments.items())[1:]:
            setattr(self, name, value)

    __init__.__signature__ = signature
    __init__.__doc__ = "Parameters:\n\n" + "\n".join(f"- ``{p.name}``: {p.doc}" for p in params)
    return __init__


def check_parameters(estimator: Any) -> None:
    """Check every parameter of ``estimator`` against its table (``type(estimator).parameters``)."""
    for param in type(estimator).parameters:
        if param.check is not None:
            param.check(param.name, getattr(estimator, param.name))
