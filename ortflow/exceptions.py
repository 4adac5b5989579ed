"""Errors raised by ortflow; each message names the argument and the offending value."""

from __future__ import annotations

import re


class OrtflowError(Exception):
    """Base class of ortflow's errors."""


class ConvergenceError(OrtflowError, ArithmeticError):
    """The training loss became NaN or infinite."""

    def __init__(self, message: str, epoch: int | None = None, batch: int | None = None):
        super().__init__(message)
        self.epoch = epoch
        self.batch = batch


class UnsupportedModelError(OrtflowError, ValueError):
    """The ONNX graph cannot be loaded or trained by this onnxruntime."""


class NotDifferentiableError(UnsupportedModelError):
    """A node between the loss and a trained weight has no gradient."""


class CheckpointError(OrtflowError, ValueError):
    """A checkpoint that cannot be trusted: unreadable, corrupt, or written for another trainer or graph."""


class DeviceError(OrtflowError, ValueError):
    """The requested device is not available."""


class UnsafePathError(OrtflowError, ValueError):
    """A path built from user input or read from a file escapes its folder."""


class TrainingPackageError(OrtflowError, ValueError):
    """A training package, a state trained from one, or the data given to train one, that cannot be used: another
    format version, a file that does not match its checksum, a state of other tensors, non-finite values, unknown
    labels."""


class OutOfMemoryError(OrtflowError, MemoryError):
    """onnxruntime could not allocate what the graph asked for (``std::bad_alloc``, a failed arena allocation)."""


class ConcurrentFitError(OrtflowError, RuntimeError):
    """A second thread called ``fit`` on an estimator that is already fitting."""


def with_training_build_hint(exc: NotDifferentiableError) -> NotDifferentiableError:
    """``exc`` (from ortflow's own gradient rules) saying that onnxruntime-training differentiates more ops."""
    return NotDifferentiableError(
        f"{exc}; onnxruntime-training differentiates more ops: install it (pip install 'ortflow[cpu]', "
        "Python <= 3.12) and use gradients='onnxruntime' or 'auto'")


def explain_gradient_failure(exc: Exception) -> UnsupportedModelError:
    """Turn onnxruntime's gradient-builder error into one that names the node and op without gradient."""
    text = str(exc)
    match = re.search(r"has not been registered: (\S+) for node (\S*)", text)
    if match:
        op, node = match.groups()
        return NotDifferentiableError(
            f"node {node!r} (op {op}) has no gradient in onnxruntime but lies between the loss and a trained "
            "weight: replace it, or leave the weights before it out of weights_to_train"
        )
    return UnsupportedModelError(f"onnxruntime could not build the gradient graph: {text.strip()}")
