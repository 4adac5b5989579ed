"""Guards around a trainer's entry points: one fit at a time per estimator, and onnxruntime's allocation failures
(a raw ``std::bad_alloc`` or arena error) as an :class:`~ortflow.exceptions.OutOfMemoryError` naming the node, the
size and, when shape inference can tell, the tensor and its shape."""

from __future__ import annotations

import functools
import re
import threading

import onnx

from ..exceptions import ConcurrentFitError, OutOfMemoryError

#: the marks of an allocation failure in onnxruntime's messages
_ALLOCATION_FAILURES = ("bad_alloc", "Failed to allocate memory", "std::length_error")
#: tensors below this are not named as the likely culprit
_LARGE = 1 << 30


def exclusive_fit(method):
    """``fit``/``partial_fit`` of a trainer: a second thread entering while one fits gets
    :class:`ConcurrentFitError` (the two would interleave their epochs in one history and one set of weights), and
    so does a fit started again in the fitting thread (from a callback); allocation failures are translated
    (:func:`translated_memory_errors`)."""

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        # the lock lives under an _rt_ name: pickling and deepcopy drop those (BaseTrainer.__getstate__)
        lock = self.__dict__.setdefault("_rt_fit_lock", threading.Lock())
        if not lock.acquire(blocking=False):
            if self.__dict__.get("_rt_fit_thread") == threading.get_ident():
                raise ConcurrentFitError(f"{method.__name__} called on this {type(self).__name__} while it is "
                                         "fitting, in the same thread (from a callback?): a fit inside a fit would "
                                         "mix their epochs and weights; fit a copy (sklearn.base.clone(estimator)) "
                                         "or call it after the fit returns")
            raise ConcurrentFitError(f"this {type(self).__name__} is already fitting in another thread: two fits of "
                                     "one estimator would mix their epochs and weights; fit a copy "
                                     "(sklearn.base.clone(estimator)) in each thread")
        self.__dict__["_rt_fit_thread"] = threading.get_ident()
        try:
            return translated_memory_errors(method)(self, *args, **kwargs)
        finally:
            self.__dict__.pop("_rt_fit_thread", None)
            lock.release()

    return guarded


def check_not_fitting(estimator, what: str) -> None:
    """Refuse ``what`` (a change of the estimator's settings) while ``estimator`` fits: the running fit built its
    runtime from the old settings and would go on with a mix of both."""
    lock = estimator.__dict__.get("_rt_fit_lock")
    if lock is not None and lock.locked():
        raise ConcurrentFitError(f"{what} while this {type(estimator).__name__} is fitting: the fit runs on the "
                                 "settings it started with; change them after it returns, or stop it "
                                 "(trainer.stop_training_ = True in a callback) first")


def translated_memory_errors(method):
    """Re-raise onnxruntime's allocation failures inside ``method`` as :class:`OutOfMemoryError`."""

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - only allocation failures are translated, the rest re-raised
            text = str(exc)  # onnxruntime's own words: a MemoryError of ortflow's (a clear message) passes
            if any(mark in text for mark in _ALLOCATION_FAILURES):
                raise OutOfMemoryError(memory_message(text, getattr(self, "model_onnx", None))) from exc
            raise

    return guarded


def memory_message(text: str, model=None) -> str:
    """What an allocation failure says: the node and the size from onnxruntime's ``text`` when it has them, else
    the largest tensor whose shape inference can tell (from constants) in ``model``."""
    node = re.search(r"running (\w+) node\. Name:'([^']*)'", text)
    size = re.search(r"buffer of size (\d+)", text)
    where = f"node {node.group(2)!r} (op {node.group(1)})" if node else "the graph"
    what = f"a buffer of {_bytes(int(size.group(1)))}" if size else "more memory than the machine has"
    message = f"onnxruntime could not allocate memory: {where} asked for {what}"
    largest = _largest_tensor(model) if model is not None else None
    if largest is not None:
        name, op, shape, nbytes = largest
        message += f"; the largest tensor the graph computes from constants is {name!r} (op {op}) of shape {shape}, " \
                   f"{_bytes(nbytes)}"
    return message + ": check the shapes the graph computes (and batch_size), or run it on a machine with more memory"


def _bytes(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _largest_tensor(model) -> tuple[str, str, list[int], int] | None:
    """The largest tensor of fully known shape (shape inference propagating constants), if above 1 GiB."""
    from ..graph.editing import load_model

    try:
        inferred = onnx.shape_inference.infer_shapes(load_model(model), data_prop=True)
    except Exception:  # noqa: BLE001 - the message does without it
        return None
    producers = {out: node.op_type for node in inferred.graph.node for out in node.output}
    best = None
    for value in inferred.graph.value_info:
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        if not dims or None in dims or not tensor.elem_type:
            continue
        count = 1
        for d in dims:
            count *= d
        nbytes = count * onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize
        if nbytes >= _LARGE and (best is None or nbytes > best[3]):
            best = (value.name, producers.get(value.name, "?"), dims, nbytes)
    return best
