"""Runtime pieces shared by the trainers: devices, device buffers, session options, the sessions themselves
(:func:`make_session`, the one place ortflow picks a session's providers and their options) and small graphs run
with IOBinding (``OnnxFunction``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from .._ort import _C, InferenceSession, OrtValue, SessionOptions, cuda_help
from ..exceptions import DeviceError
from .placement import Placement
from .validation import check_device, check_precision, device_index, resolve_device


# --- device buffers -------------------------------------------------------------------------------------------
def ort_device(device: str):
    """The ``OrtDevice`` of ``'cpu'``, ``'cuda'`` or ``'cuda:N'``."""
    kind, _ = check_device(device)
    device = resolve_device(device)
    dev_type = _C.OrtDevice.cpu() if kind == "cpu" else _C.OrtDevice.cuda()
    return _C.OrtDevice(dev_type, _C.OrtDevice.default_memory(), device_index(device) if kind == "cuda" else 0)


def to_ortvalue(value: Any, device: str = "cpu") -> OrtValue:
    """``value`` (OrtValue, DeviceBuffer or array-like) as an OrtValue on ``device``. A C-contiguous CPU array is
    wrapped without a copy; float64 becomes float32 (ortflow trains float32 graphs). Keep the returned object
    referenced while onnxruntime uses it: a C OrtValue taken from it does not own the memory."""
    if isinstance(value, OrtValue):
        return value
    if isinstance(value, DeviceBuffer):
        return value.ortvalue
    if isinstance(value, _C.OrtValue):
        return OrtValue(value)
    array = np.ascontiguousarray(value)
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    kind, _ = check_device(device)
    if kind == "cpu":
        return OrtValue.ortvalue_from_numpy(array)
    return OrtValue.ortvalue_from_numpy(array, "cuda", device_index(device))


class DeviceBuffer:
    """A tensor (float32 unless ``dtype`` says otherwise) allocated once on a device. On CPU, ``array`` shares its
    memory with ``ortvalue``."""

    __slots__ = ("array", "device", "ortvalue", "c", "shape", "dtype")

    def __init__(self, shape: Sequence[int], device: str = "cpu", value: np.ndarray | None = None, dtype=np.float32):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype = np.dtype(dtype)
        self.device = device = resolve_device(device)
        kind, _ = check_device(device)
        if kind == "cpu":
            self.array = np.zeros(self.shape, dtype=dtype)
            self.ortvalue = OrtValue.ortvalue_from_numpy(self.array)
        else:
            self.array = None
            self.ortvalue = OrtValue.ortvalue_from_shape_and_type(self.shape, dtype, "cuda", device_index(device))
        self.c = self.ortvalue._ortvalue  # the C object, what bindings and vectors take
        if value is not None:
            self.write(value)

    @classmethod
    def view(cls, parent: DeviceBuffer, offset: int, shape: Sequence[int]) -> DeviceBuffer:
        """A buffer of ``shape`` sharing the memory of the CPU buffer ``parent`` from its element ``offset``."""
        if parent.array is None:
            raise ValueError("views of a device buffer exist only on CPU")
        obj = cls.__new__(cls)
        obj.shape = tuple(int(d) for d in shape)
        obj.dtype = parent.dtype
        obj.device = parent.device
        obj.array = parent.array.reshape(-1)[offset : offset + int(np.prod(obj.shape))].reshape(obj.shape)
        obj.ortvalue = OrtValue.ortvalue_from_numpy(obj.array)
        obj.c = obj.ortvalue._ortvalue
        return obj

    def write(self, value) -> None:
        """Copy ``value`` (same shape) into the buffer."""
        if self.array is not None:
            np.copyto(self.array, value, casting="same_kind")
        else:
            self.ortvalue.update_inplace(np.ascontiguousarray(value, dtype=self.dtype).reshape(self.shape))

    def read(self) -> np.ndarray:
        """A numpy copy of the buffer."""
        return self.array.copy() if self.array is not None else self.ortvalue.numpy()

    def scalar(self) -> float:
        """The value of a one-element buffer."""
        return float(self.array if self.array is not None else self.ortvalue.numpy())

    def gather(self, source: np.ndarray, rows) -> None:
        """Copy ``source[rows]`` (``rows``: a slice or indices along axis 0) into the buffer."""
        if self.array is None:
            self.write(source[rows])
        elif isinstance(rows, slice):
            np.copyto(self.array, source[rows])
        else:
            np.take(source, rows, axis=0, out=self.array)


# --- small graphs ------------------------------------------------------------------------------------------
def c_session(session: InferenceSession):
    """onnxruntime's C session behind ``session``: what IOBinding, ``TrainingAgent`` and the hot loops run (the one
    place ortflow reaches into onnxruntime's private ``_sess``)."""
    return session._sess


# --- sessions --------------------------------------------------------------------------------------------
def cuda_provider_options(device: str, precision: str = "fp32") -> dict[str, str]:
    """The CUDA provider's options for ``device`` ('cuda' or 'cuda:N') at ``precision``
    (:meth:`ortflow.runtime.placement.Placement.cuda_options`)."""
    return Placement(resolve_device(device), check_precision("precision", precision)).cuda_options()


def session_providers(placement: Placement | str) -> list:
    """The ``providers`` argument of a session at ``placement`` (a device string: fp32 products)."""
    return Placement.of(placement).providers()


def make_session(model: onnx.ModelProto | bytes, placement: Placement | str = "cpu",
                 options: SessionOptions | None = None) -> InferenceSession:
    """An onnxruntime session of ``model`` at ``placement`` (a :class:`~ortflow.runtime.placement.Placement`, or a device
    string: fp32 products) with ``options`` (default :func:`make_session_options`), its providers the placement's.
    On CUDA, a provider that fails to load (onnxruntime then falls back to the CPU with a log line) is a
    DeviceError naming the CUDA and cuDNN this build looks for."""
    placement = Placement.of(placement)
    data = model if isinstance(model, bytes) else model.SerializeToString()
    providers = placement.providers()
    session = InferenceSession(data, options or make_session_options(), providers=providers)
    if placement.kind != "cpu" and "CUDAExecutionProvider" not in session.get_providers():
        raise DeviceError(f"device={placement.device!r}: onnxruntime's CUDA provider did not load (the session runs "
                          f"on {session.get_providers()}): {cuda_help()}")
    return session


class OnnxFunction:
    """A graph run on OrtValues with IOBinding: ``run`` binds per call, ``bind`` + ``run_bound`` bind once."""

    def __init__(self, model: onnx.ModelProto, placement: Placement | str = "cpu",
                 options: SessionOptions | None = None):
        self.model = model
        self.placement = Placement.of(placement)
        self.device = device = self.placement.device
        self.session = make_session(model, self.placement, options)
        self._sess = c_session(self.session)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._device = ort_device(device)

    def bind(self, inputs: Sequence, outputs: Sequence | None = None):
        """A C-level IOBinding of ``inputs`` (OrtValues, in input order) and ``outputs`` (pre-allocated OrtValues,
        or None to let onnxruntime allocate them on the device at each run)."""
        binding = _C.SessionIOBinding(self._sess)
        for name, value in _zip_exact(self.input_names, inputs):
            binding.bind_ortvalue_input(name, _c_value(value))
        if outputs is None:
            for name in self.output_names:
                binding.bind_output(name, self._device)
        else:
            for name, value in _zip_exact(self.output_names, outputs):
                binding.bind_ortvalue_output(name, _c_value(value))
        return binding

    def bind_named(self, inputs: dict, outputs: dict):
        """A C-level IOBinding of the named ``inputs`` and ``outputs`` only (name -> OrtValue); the caller binds the
        others before each run (by address: :mod:`ortflow.runtime.device_data`)."""
        binding = _C.SessionIOBinding(self._sess)
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, _c_value(value))
        for name, value in outputs.items():
            binding.bind_ortvalue_output(name, _c_value(value))
        return binding

    def run_bound(self, binding) -> None:
        self._sess.run_with_iobinding(binding, None)

    @property
    def run_with_iobinding(self) -> Callable:
        """The C session's ``run_with_iobinding(binding, run_options)``, for a hot loop to look up once."""
        return self._sess.run_with_iobinding

    def run(self, *inputs) -> list[OrtValue]:
        """Run on ``inputs`` (OrtValues or arrays); outputs are OrtValues on the device."""
        values = [to_ortvalue(v, self.device) for v in inputs]
        binding = self.bind(values)
        self.run_bound(binding)
        return [OrtValue(v) for v in binding.get_outputs()]


def _zip_exact(names: Sequence[str], values: Sequence) -> list:
    if len(names) != len(values):
        raise ValueError(f"{len(values)} values for the {len(names)} names {list(names)}")
    return list(zip(names, values))


def _c_value(value):
    if isinstance(value, DeviceBuffer):
        return value.c
    return value._ortvalue if isinstance(value, OrtValue) else value


#: Multiply-adds per batch (batch rows x float weights of the graph) under which one intra-op thread beats all
#: cores: waking and joining the pool around every node costs more than the split saves. Calibrated by
#: ``python -m bench.threads`` on the reference machine (docs/PERFORMANCE.md, threads): the geometric mean of the
#: largest work one thread won or tied in three runs (1.9M: MLP (128,128), batch 64) and the smallest work all
#: cores won in all three (5.9M: MLP (256,256), batch 64). Forward-backward training and onnxruntime's artifacts.
THREADS_WORK_THRESHOLD = 3_300_000
#: The same for full training on ortflow's step graphs (forward, backward and update in one session run per
#: batch): one thread won every case measured, up to D-wide (23.5M, 1.15-1.6x faster than two threads in three
#: runs), so there is nothing to calibrate against; four times the largest work measured.
STEP_GRAPH_THREADS_THRESHOLD = 100_000_000


def all_cores() -> int:
    """The CPUs this process may run on (its affinity mask, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity masks
        return os.cpu_count() or 1


def threads_for_work(batch_size: int, n_weights: int, device: str = "cpu",
                     threshold: int = THREADS_WORK_THRESHOLD) -> int:
    """Intra-op threads for batches of ``batch_size`` rows through a graph of ``n_weights`` float weights: one
    thread when ``batch_size * n_weights`` is under ``threshold`` (a batch too small to split:
    waking a second thread costs more than it saves), all cores above it and on CUDA. The rule depends on the work
    only, so a fit picks the same count, and gives the same numbers, whatever else the machine runs."""
    cores = all_cores()
    if resolve_device(device) != "cpu":
        return cores
    return 1 if int(batch_size) * int(n_weights) < threshold else cores


def make_session_options(n_threads: int | None = None) -> SessionOptions:
    """Session options logging errors only (onnxruntime warns about harmless shape merges in training graphs),
    with ``n_threads`` intra-op threads when given (default: onnxruntime's choice, all cores). The device and the
    precision are not options: a session takes them from its :class:`~ortflow.runtime.placement.Placement`."""
    options = SessionOptions()
    options.log_severity_level = 3
    if n_threads:
        options.intra_op_num_threads = int(n_threads)
    return options


def training_session_options(n_threads: int | None, spinning: bool) -> SessionOptions:
    """A trainer's session options: :func:`make_session_options` with ``n_threads``, the intra-op threads spinning
    between runs only when ``spinning`` (off in a streamed fit: the reader thread needs the core)."""
    options = make_session_options(n_threads)
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options
