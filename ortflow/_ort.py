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


#: cuDNN's major version by the CUDA major version onnxruntime's CUDA provider is built for (onnxruntime's
#: requirement table: CUDA 11.8 builds use cuDNN 8, CUDA 12 and 13 builds cuDNN 9)
CUDNN_FOR_CUDA = {"11": "8", "12": "9", "13": "9"}


def package_name() -> str:
    """The installed onnxruntime's distribution: ``'onnxruntime'``, ``'onnxruntime-gpu'``,
    ``'onnxruntime-training'``, ``'onnxruntime-training-cpu'``..."""
    info = importlib.import_module("onnxruntime.capi.build_and_package_info")
    return getattr(info, "package_name", "onnxruntime")


def cuda_build() -> dict[str, str] | None:
    """The CUDA and cuDNN this onnxruntime's CUDA provider was built for, and so looks for when it loads
    (``{'cuda': '13.0', 'cudnn': '9'}``), or None for a build without the CUDA provider."""
    info = importlib.import_module("onnxruntime.capi.build_and_package_info")
    cuda = getattr(info, "cuda_version", None)
    if not cuda or "CUDAExecutionProvider" not in ort.get_available_providers():
        return None
    return {"cuda": str(cuda), "cudnn": CUDNN_FOR_CUDA.get(str(cuda).split(".")[0], "?")}


def cuda_help() -> str:
    """What to do when the CUDA provider is absent or does not load, naming what this build looks for."""
    build = cuda_build()
    if build is None:
        return (f"this onnxruntime build has no CUDA provider ({package_name()} {ort.__version__}, providers "
                f"{ort.get_available_providers()}): install the GPU build "
                "instead, pip install 'ortflow[gpu]' (onnxruntime-gpu >= 1.31 with NVIDIA's CUDA 13 and cuDNN 9 "
                "wheels; uninstall onnxruntime/onnxruntime-training first, they share the module)")
    major = build["cuda"].split(".")[0]
    return (f"{package_name()} {ort.__version__} looks for CUDA {build['cuda']} (libcudart.so.{major}, "
            f"libcublas.so.{major}) and cuDNN {build['cudnn']} (libcudnn.so.{build['cudnn']}): install NVIDIA's "
            f"wheels (pip install 'onnxruntime-gpu[cuda,cudnn]', or 'ortflow[gpu]'), or put the system's on "
            "LD_LIBRARY_PATH; an NVIDIA driver for that CUDA must be present "
            "(onnxruntime.print_debug_info() lists what was found)")


def nvml(query, index: int = 0):
    """``query(pynvml, handle of GPU index)`` through NVIDIA's management library (nvidia-ml-py, in the ``gpu``
    extra), or None when it, the driver or the GPU is absent."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            return query(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no such GPU: nothing to say
        return None


def gpu_name(index: int = 0) -> str | None:
    """The name of GPU ``index`` (None when not known: see :func:`nvml`)."""
    name = nvml(lambda nv, handle: nv.nvmlDeviceGetName(handle), index)
    return name.decode() if isinstance(name, bytes) else name


def device_info(gpu: int = 0) -> dict:
    """What ortflow runs on, for logs and bug reports: the onnxruntime build (``backend``, ``package``,
    ``version``), its providers, the CUDA and cuDNN its CUDA provider looks for (None without one) and the name of
    GPU ``gpu`` (None when not known)."""
    build = cuda_build()
    return {
        "backend": backend(),
        "package": package_name(),
        "version": ort.__version__,
        "providers": list(ort.get_available_providers()),
        "cuda_version": build and build["cuda"],
        "cudnn_version": build and build["cudnn"],
        "gpu": gpu_name(gpu) if build else None,
    }


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
    "cuda_build",
    "cuda_help",
    "device_info",
    "gpu_name",
    "max_ir_version",
    "nvml",
    "package_name",
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
