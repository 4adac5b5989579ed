"""``Placement``: where and how a trainer's sessions run, resolved once into one value.

A trainer resolves its ``device`` (``'auto'`` becomes ``'cuda'`` or ``'cpu'``, checked against this onnxruntime
build) and its ``precision`` once per fit, and hands the :class:`Placement` to every session it makes
(:func:`ortflow.runtime.sessions.make_session`, :class:`ortflow.runtime.sessions.OnnxFunction`): the providers and their options come
from it, not from ``SessionOptions`` entries. Buffers take ``placement.device``, the resolved device string.
"""

from __future__ import annotations

from dataclasses import dataclass

from .validation import check_device, check_precision, device_index, resolve_device

__all__ = ["Placement"]


@dataclass(frozen=True)
class Placement:
    """A resolved device (``'cpu'``, ``'cuda'`` or ``'cuda:N'``, never ``'auto'``) and the float32 ``precision`` of
    matrix products on CUDA (``'fp32'`` or ``'tf32'``, :data:`ortflow.runtime.validation.PRECISIONS`)."""

    device: str = "cpu"
    precision: str = "fp32"

    @classmethod
    def of(cls, device: str | Placement = "cpu", precision: str = "fp32") -> Placement:
        """``device`` resolved and checked (a :class:`Placement` is returned as it is), with ``precision``."""
        if isinstance(device, Placement):
            return device
        resolved = resolve_device(device)
        check_device(resolved)
        return cls(resolved, check_precision("precision", precision))

    @property
    def kind(self) -> str:
        """``'cpu'`` or ``'cuda'``."""
        return self.device.partition(":")[0]

    @property
    def index(self) -> int:
        """The CUDA device's index (0 on the CPU)."""
        return device_index(self.device)

    def cuda_options(self) -> dict[str, str]:
        """The CUDA provider's options: the device, and ``use_tf32`` '0' for exact float32 products (onnxruntime's
        CUDA provider uses TF32 unless told not to; PyTorch does not), '1' for TF32."""
        return {"device_id": str(self.index), "use_tf32": "1" if self.precision == "tf32" else "0"}

    def providers(self) -> list:
        """The ``providers`` argument of a session: the CUDA provider with its options before the CPU's, or the
        CPU's alone."""
        if self.kind == "cpu":
            return ["CPUExecutionProvider"]
        return [("CUDAExecutionProvider", self.cuda_options()), "CPUExecutionProvider"]

    def __str__(self) -> str:
        return self.device
