"""The one place ortflow imports onnxruntime and its training submodules from.

``import onnxruntime.training`` runs a package ``__init__`` that imports torch (through ``amp`` and ``optim``),
even in the CPU build, although the submodules ortflow uses (``api``, ``artifacts``, ``onnxblock``) never touch
torch. When the package is not imported yet, we register it in ``sys.modules`` without running that ``__init__``,
so ortflow does not depend on torch.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
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
        "ortflow needs onnxruntime-training 1.19.2: pip install 'ortflow[cpu]' "
        "(or 'ortflow[cuda]' for the CUDA build); never install plain onnxruntime beside it."
    ) from exc


def _load_training_package() -> types.ModuleType:
    if "onnxruntime.training" in sys.modules:
        return sys.modules["onnxruntime.training"]
    spec = importlib.util.find_spec("onnxruntime.training")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"onnxruntime {ort.__version__} at {ort.__file__} is not a training build: install "
            "onnxruntime-training-cpu==1.19.2 (or onnxruntime-training==1.19.2) and uninstall plain onnxruntime."
        )
    package = types.ModuleType("onnxruntime.training")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    package.__package__ = "onnxruntime.training"
    sys.modules["onnxruntime.training"] = package
    return package


_load_training_package()
with _torch_hidden():
    api = importlib.import_module("onnxruntime.training.api")
    artifacts = importlib.import_module("onnxruntime.training.artifacts")
    onnxblock = importlib.import_module("onnxruntime.training.onnxblock")

from onnxruntime.capi._pybind_state import (  # noqa: E402
    OrtModuleGraphBuilder,
    OrtModuleGraphBuilderConfiguration,
    OrtValueCache,
    OrtValueVector,
    PartialGraphExecutionState,
    TrainingAgent,
)

OrtValue = ort.OrtValue
InferenceSession = ort.InferenceSession
SessionOptions = ort.SessionOptions

#: Highest ONNX IR version and default-domain opset this onnxruntime accepts.
MAX_IR_VERSION = 10
MAX_OPSET = 21

__all__ = [
    "MAX_IR_VERSION",
    "MAX_OPSET",
    "InferenceSession",
    "OrtModuleGraphBuilder",
    "OrtModuleGraphBuilderConfiguration",
    "OrtValue",
    "OrtValueCache",
    "OrtValueVector",
    "PartialGraphExecutionState",
    "SessionOptions",
    "TrainingAgent",
    "captured_native_stderr",
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
