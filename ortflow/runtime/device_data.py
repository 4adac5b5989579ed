"""Training data kept on the device (issue 39, item 3): copied there once, each batch bound by address.

On CUDA, a training loop that copies every batch from the host and reads every step's loss back spends more time
around the kernels than in them (issue 39: the 2048x2048 MLP's step graph alone takes 93 ms an epoch in fp32,
through the trainer 135 ms). The pieces here remove both transfers from the loop, on any device (the CPU included,
where they are tested):

- :class:`DeviceRows`: the arrays copied to the device once; a batch of consecutive rows is bound to a session
  input by its address (``SessionIOBinding.bind_input`` with a pointer into the device array: no copy, no
  allocation). A shuffled epoch first permutes the rows on the device (one ``Gather`` into a second buffer; the
  permutation, ``n`` int64, is the only host-to-device copy of the epoch), then slices them in order.
- :class:`DeviceLosses`: a device vector the step ``i`` writes its loss into (``bind_output`` at the address of
  element ``i``), read back once, when the epoch ends; :class:`DeviceScalars`, its base, also binds element ``i``
  as a step's scalar input (full training's step numbers, written once per epoch).
- :func:`fits_on_device`: whether the data (twice, for the shuffled copy) fits in the device's free memory (in
  :data:`DEVICE_DATA_LIMIT` bytes where that is not known).

Full training runs them through :meth:`ortflow.engines.full_step.StepGraphRuntime.device_pass`: it binds the batch
feeds and the loss output per step instead of copying rows into bound buffers and reading the loss; the
non-finite-loss check happens when the losses are read (see docs/DESIGN.md, "The epoch loop").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from .._ort import nvml
from .sessions import DeviceBuffer, OnnxFunction, ort_device, to_ortvalue
from .validation import device_index, resolve_device

#: the share of the device's free memory the data may take (it is held twice when shuffled)
DEVICE_DATA_FRACTION = 0.5
#: the bytes the data may take on a GPU whose free memory is not known (twice the data when shuffled): 1 GiB,
#: a small share of any GPU onnxruntime-gpu supports, beside the weights and the activations of a batch
DEVICE_DATA_LIMIT = 1 << 30


def free_device_memory(device: str) -> int | None:
    """Free bytes on ``device`` ('cuda:N', through nvidia-ml-py), None when not known (no nvidia-ml-py, the CPU)."""
    device = resolve_device(device)
    if not device.startswith("cuda"):
        return None
    free = nvml(lambda nv, handle: nv.nvmlDeviceGetMemoryInfo(handle).free, device_index(device))
    return None if free is None else int(free)


def fits_on_device(nbytes: int, device: str, shuffled: bool = True, free: int | None = None,
                   limit: int = DEVICE_DATA_LIMIT) -> bool:
    """Whether ``nbytes`` of training data (twice when ``shuffled``) fit in :data:`DEVICE_DATA_FRACTION` of the
    free memory of ``device`` (``free`` bytes, default :func:`free_device_memory`); always on the CPU, where the
    data is in memory already. Where the free memory is not known (no nvidia-ml-py; onnxruntime's Python API does
    not report it), in ``limit`` bytes (:data:`DEVICE_DATA_LIMIT`)."""
    if resolve_device(device) == "cpu":
        return True
    free = free_device_memory(device) if free is None else free
    held = nbytes * (2 if shuffled else 1)
    return held <= (limit if free is None else DEVICE_DATA_FRACTION * free)


def _gather_rows_model(dtype: np.dtype, rank: int) -> onnx.ModelProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph([helper.make_node("Gather", ["data", "rows"], ["out"], axis=0)], "gather_rows",
                              [helper.make_tensor_value_info("data", elem, [None] * rank),
                               helper.make_tensor_value_info("rows", TensorProto.INT64, [None])],
                              [helper.make_tensor_value_info("out", elem, [None] * rank)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


class DeviceRows:
    """``arrays`` (same number of rows; float64 becomes float32) copied once to ``device``; batches of consecutive
    rows bound by address. After :meth:`shuffle`, row ``i`` is the original row ``permutation[i]``."""

    def __init__(self, arrays: Sequence[np.ndarray], device: str = "cpu"):
        self.device = device = resolve_device(device)
        arrays = [np.ascontiguousarray(a, dtype=np.float32 if a.dtype == np.float64 else a.dtype) for a in arrays]
        if len({len(a) for a in arrays}) != 1:
            raise ValueError(f"the arrays have different numbers of rows: {[len(a) for a in arrays]}")
        self.n_rows = len(arrays[0])
        self.dtypes = [a.dtype for a in arrays]
        self.tails = [a.shape[1:] for a in arrays]
        self.row_bytes = [a.itemsize * int(np.prod(a.shape[1:], dtype=np.int64)) for a in arrays]
        self.nbytes = sum(a.nbytes for a in arrays)
        self._device = ort_device(device)
        self._data = [to_ortvalue(a, device) for a in arrays]  # the one copy to the device
        self._host = arrays if device == "cpu" else None  # keeps the CPU arrays alive (the OrtValues wrap them)
        self._shuffled: list[DeviceBuffer] | None = None
        self._gathers: list[OnnxFunction] | None = None
        self._current = [v._ortvalue for v in self._data]

    def shuffle(self, permutation: np.ndarray) -> None:
        """Reorder the rows on the device: row ``i`` becomes ``permutation[i]`` of the data as copied (one
        ``Gather`` per array into a second buffer, allocated on first use)."""
        rows = np.ascontiguousarray(permutation, dtype=np.int64)
        if rows.shape != (self.n_rows,):
            raise ValueError(f"a permutation of {self.n_rows} rows is needed, not shape {rows.shape}")
        if self._shuffled is None:
            self._shuffled = [DeviceBuffer((self.n_rows, *t), self.device, dtype=d)
                              for t, d in zip(self.tails, self.dtypes)]
            self._gathers = [OnnxFunction(_gather_rows_model(d, 1 + len(t)), self.device)
                             for t, d in zip(self.tails, self.dtypes)]
        index = to_ortvalue(rows, self.device)
        for data, out, gather in zip(self._data, self._shuffled, self._gathers):
            gather.run_bound(gather.bind([data, index], [out]))
        self._current = [b.c for b in self._shuffled]

    def unshuffle(self) -> None:
        """Back to the rows in their original order."""
        self._current = [v._ortvalue for v in self._data]

    def bind(self, binding, names: Sequence[str], rows: slice) -> int:
        """Bind rows ``rows.start`` to ``rows.stop`` (clipped to the data) of each array to the input of the same
        position in ``names`` of ``binding`` (a ``SessionIOBinding``), by address; the number of rows bound."""
        start, stop = rows.start or 0, min(rows.stop, self.n_rows)
        if rows.step not in (None, 1) or not 0 <= start < stop:
            raise ValueError(f"rows {rows} is not a non-empty run of consecutive rows of {self.n_rows}")
        for name, value, dtype, tail, row_bytes in zip(names, self._current, self.dtypes, self.tails,
                                                       self.row_bytes):
            binding.bind_input(name, self._device, dtype, [stop - start, *tail],
                               value.data_ptr() + start * row_bytes)
        return stop - start

    def read(self) -> list[np.ndarray]:
        """The rows as they are on the device now (a copy), for checks."""
        return [np.array(v.numpy()) for v in self._current]


class DeviceScalars:
    """A float32 vector of ``capacity`` scalars on ``device``, element ``i`` bound (by address) to a scalar input or
    output of step ``i``: the losses a loop writes (:class:`DeviceLosses`), the step numbers it reads."""

    def __init__(self, capacity: int, device: str = "cpu"):
        self.buffer = DeviceBuffer((int(capacity),), device)
        self._device = ort_device(device)
        self._address = self.buffer.c.data_ptr()

    def _at(self, index: int) -> int:
        if not 0 <= index < self.buffer.shape[0]:
            raise IndexError(f"scalar {index} is outside the {self.buffer.shape[0]} kept")
        return self._address + 4 * index

    def bind(self, binding, name: str, index: int) -> None:
        """Bind the scalar output ``name`` of ``binding`` to element ``index``."""
        binding.bind_output(name, self._device, np.float32, [], self._at(index))

    def bind_input(self, binding, name: str, index: int) -> None:
        """Bind the scalar input ``name`` of ``binding`` to element ``index``."""
        binding.bind_input(name, self._device, np.float32, [], self._at(index))

    def read(self, count: int) -> np.ndarray:
        """The first ``count`` values (one device-to-host copy), as float64."""
        return self.buffer.read()[:count].astype(np.float64)


class DeviceLosses(DeviceScalars):
    """A float32 vector of ``capacity`` losses on ``device``; step ``i`` writes element ``i`` (:meth:`bind`)."""
