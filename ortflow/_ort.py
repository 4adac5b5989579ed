"""The one place ortflow imports onnxruntime from, and the backend it runs on.

Two builds share the module name ``onnxruntime`` (one per environment): the training build
(onnxruntime-training 1.19.2: ``onnxruntime.training`` and the ``TrainingAgent`` classes) and the plain, maintained
onnxruntime (>= 1.20). :func:`backend` says which is installed: ``'training'`` or ``'plain'``. On the plain build
the training-only names below (``api``, ``artifacts``, ``onnxblock``, ``TrainingAgent``...) are None and ortflow
trains with its own standard-ONNX gradient graphs (:mod:`ortflow.autodiff`).

``import onnxruntime.training`` runs a package ``__init__`` that imports torch (through ``amp`` and ``optim``),
even in the CPU build, although the submodules ortflow uses (``api``, ``artifacts``, ``onnxblock``) never touch
torch. When the package is not imported yet, we register it in ``sys.modules`` without running that ``__init__``,
so ortflow does not depend on torch.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import re
import sys
import tempfile
import types


@contextlib.contextmanager
def _torch_hidden():
    """onnxruntime imports torch only for helpers ortflow never uses: the build check of its ``__init__``
    (capi/onnxruntime_validation.py probes ``onnxruntime.training.ortmodule``) and the PyTorch export helpers of
    ``onnxruntime.tools`` (imported by ``training.artifacts``); with torch installed that costs a second or more per
    process. While ortflow imports onnxruntime's modules, torch is marked absent (None in sys.modules: its import
    fails at once with ImportError, as if not installed) unless already imported; the mark is removed after."""
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None
    try:
        yield
    finally:
        if hide and "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]


try:
    with _torch_hidden():
        import onnxruntime as ort
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "ortflow needs onnxruntime: pip install 'ortflow[ort]' (plain onnxruntime >= 1.20, any Python >= 3.9) or "
        "'ortflow[cpu]' (onnxruntime-training-cpu 1.19.2, Python <= 3.12); never install both."
    ) from exc

#: onnxruntime's pybind module: the classes it has no Python wrapper for (OrtDevice, SessionIOBinding, the C
#: OrtValue, TrainingGraphTransformerConfiguration); the one alias the other modules import
_C = ort.capi._pybind_state
TRAINING = hasattr(_C, "TrainingAgent") and importlib.util.find_spec("onnxruntime.training") is not None


def backend() -> str:
    """``'training'`` when onnxruntime-training is installed (onnxruntime's gradients and training API available),
    ``'plain'`` for the plain onnxruntime (ortflow's own gradient graphs only)."""
    return "training" if TRAINING else "plain"


def runtime_name() -> str:
    """The installed build and version, for messages: ``'onnxruntime-training 1.19.2'`` or ``'onnxruntime 1.23.2'``."""
    return f"onnxruntime{'-training' if TRAINING else ''} {ort.__version__}"


def require_training(what: str) -> None:
    """Raise ImportError saying that ``what`` needs the training build, when the plain onnxruntime is installed."""
    if not TRAINING:
        raise ImportError(
            f"{what} needs onnxruntime-training (pip install 'ortflow[cpu]', Python <= 3.12); the installed "
            f"{runtime_name()} is the plain build"
        )


def _load_training_package() -> types.ModuleType:
    if "onnxruntime.training" in sys.modules:
        return sys.modules["onnxruntime.training"]
    spec = importlib.util.find_spec("onnxruntime.training")
    package = types.ModuleType("onnxruntime.training")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    package.__package__ = "onnxruntime.training"
    sys.modules["onnxruntime.training"] = package
    return package


if TRAINING:
    _load_training_package()
    with _torch_hidden():
        api = importlib.import_module("onnxruntime.training.api")
        artifacts = importlib.import_module("onnxruntime.training.artifacts")
        onnxblock = importlib.import_module("onnxruntime.training.onnxblock")
    OrtModuleGraphBuilder = _C.OrtModuleGraphBuilder
    OrtModuleGraphBuilderConfiguration = _C.OrtModuleGraphBuilderConfiguration
    OrtValueCache = _C.OrtValueCache
    PartialGraphExecutionState = _C.PartialGraphExecutionState
    TrainingAgent = _C.TrainingAgent
else:
    api = artifacts = onnxblock = None
    OrtModuleGraphBuilder = OrtModuleGraphBuilderConfiguration = OrtValueCache = None
    PartialGraphExecutionState = TrainingAgent = None
OrtValueVector = getattr(_C, "OrtValueVector", None)

OrtValue = ort.OrtValue
InferenceSession = ort.InferenceSession
SessionOptions = ort.SessionOptions

#: Highest default-domain opset ortflow converts to and checks (both builds read opset 21).
MAX_OPSET = 21
#: Highest ONNX IR version onnxruntime-training 1.19.2 accepts (see :func:`max_ir_version` for either build).
MAX_IR_VERSION = 10


@functools.lru_cache(maxsize=None)
def max_ir_version() -> int:
    """The highest ONNX IR version the installed onnxruntime loads: 10 on the training build; on the plain build,
    read once from onnxruntime's own refusal of a newer model."""
    if TRAINING:
        return MAX_IR_VERSION
    from onnx import TensorProto, helper

    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [value],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", MAX_OPSET)], ir_version=99)
    try:
        InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - the message carries the answer
        match = re.search(r"max supported IR version: (\d+)", str(exc))
        if match:
            return int(match.group(1))
    return MAX_IR_VERSION  # pragma: no cover - an onnxruntime that words it otherwise: the safe value


__all__ = [
    "MAX_IR_VERSION",
    "MAX_OPSET",
    "TRAINING",
    "InferenceSession",
    "OrtModuleGraphBuilder",
    "OrtModuleGraphBuilderConfiguration",
    "OrtValue",
    "OrtValueCache",
    "OrtValueVector",
    "PartialGraphExecutionState",
    "SessionOptions",
    "TrainingAgent",
    "backend",
    "captured_native_stderr",
    "max_ir_version",
    "require_training",
    "runtime_name",
    "api",
    "artifacts",
    "onnxblock",
    "ort",
]


@contextlib.contextmanager
def captured_native_stderr():
    """Capture what onnxruntime's C++ code writes to file descriptor 2 (its gradient builder logs every graph
    transformer at INFO level, whatever the logger severity). Yields a list that receives the text."""
    captured: list[str] = []
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (some notebooks): nothing to capture
        yield captured
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield captured
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            captured.append(tmp.read().decode("utf-8", "replace"))
