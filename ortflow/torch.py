"""An ONNX graph as a PyTorch layer: :class:`OnnxModule`.

The forward and backward passes run in onnxruntime (``TrainingAgent``, through
:class:`ortflow.fwbw.OrtGradientForwardBackward`, whose training graph takes the trained weights as inputs); torch
owns the weights as ``nn.Parameter`` objects, so its optimizers, LR schedulers, ``state_dict`` and pickling apply.

Tensors cross between torch and onnxruntime through DLPack without copies. Per batch, nothing is copied on the hot
path when the inputs and the output gradients are contiguous tensors of the graph's dtype on the module's device:
the inputs and the parameters are viewed as OrtValues, onnxruntime allocates the outputs and the gradients and
torch views them. A non-contiguous tensor (a strided slice, an expanded gradient such as the one of ``y.sum()``) is
copied once by ``.contiguous()``, since onnxruntime reads dense row-major buffers only.

This module needs torch (``pip install 'ortflow[torch]'``); ``import ortflow`` does not import it.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from . import graph as g
from ._ort import OrtValueVector, PartialGraphExecutionState, ort
from .exceptions import UnsupportedModelError
from .fwbw.forward_backward import OnnxFunction, OrtGradientForwardBackward, quiet_options
from .validation import check_weights_to_train

_C = ort.capi._pybind_state

__all__ = ["OnnxModule", "parameter_name"]

_TORCH_DTYPES = {
    onnx.TensorProto.FLOAT: torch.float32,
    onnx.TensorProto.DOUBLE: torch.float64,
    onnx.TensorProto.FLOAT16: torch.float16,
    onnx.TensorProto.BFLOAT16: torch.bfloat16,
    onnx.TensorProto.INT64: torch.int64,
    onnx.TensorProto.INT32: torch.int32,
    onnx.TensorProto.INT8: torch.int8,
    onnx.TensorProto.UINT8: torch.uint8,
    onnx.TensorProto.BOOL: torch.bool,
}


def parameter_name(initializer: str, taken: set[str] | frozenset = frozenset()) -> str:
    """A valid ``nn.Module`` attribute name for ``initializer``, not in ``taken``: characters other than letters,
    digits and ``_`` become ``_``, a leading digit or a keyword gets a ``p_`` prefix, a clash a ``_N`` suffix."""
    name = re.sub(r"\W", "_", initializer, flags=re.ASCII) or "p"
    if name[0].isdigit() or keyword.iskeyword(name) or hasattr(nn.Module, name):
        name = "p_" + name
    base, i = name, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    return name


def _to_ort(tensor: torch.Tensor):
    """A C OrtValue viewing ``tensor`` (made contiguous first when it is not)."""
    tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return _C.OrtValue.from_dlpack(tensor.__dlpack__(), tensor.dtype == torch.bool)


def _to_torch(value) -> torch.Tensor:
    """A torch tensor viewing the C OrtValue ``value`` (which the tensor keeps alive)."""
    return torch.utils.dlpack.from_dlpack(value.to_dlpack())


def _device_string(device: torch.device) -> str:
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return f"cuda:{device.index or 0}"
    raise ValueError(f"OnnxModule runs on cpu or cuda tensors, not {device}")


class _Runtime:
    """The onnxruntime side of an :class:`OnnxModule` on one device: one forward-backward object per set of
    inputs needing a gradient (built on first use), their static-shape agents, and an inference function."""

    def __init__(self, module: OnnxModule, device: str):
        self.module = module
        self.device = device
        threads = module.n_threads or torch.get_num_threads()
        self.options = quiet_options(threads)
        self._fwbw: dict[tuple[str, ...], OrtGradientForwardBackward] = {}
        self._static_keys: dict[tuple[str, ...], set] = {}
        self._inference: OnnxFunction | None = None

    def fwbw(self, inputs_with_grad: tuple[str, ...]) -> OrtGradientForwardBackward:
        if inputs_with_grad not in self._fwbw:
            self._fwbw[inputs_with_grad] = OrtGradientForwardBackward(
                self.module.onnx_model_, weights_to_train=self.module.weights_to_train_,
                input_names_to_train=list(inputs_with_grad), device=self.device, session_options=self.options)
            self._static_keys[inputs_with_grad] = set()
        return self._fwbw[inputs_with_grad]

    def agent(self, fb: OrtGradientForwardBackward, key: tuple[str, ...], inputs: Sequence[torch.Tensor]):
        """A static-shape agent for these input shapes while fewer than ``static_shapes`` exist, else the agent
        for any shape."""
        shapes = tuple(tuple(t.shape) for t in inputs)
        known = self._static_keys[key]
        if shapes in known or len(known) < self.module.static_shapes:
            known.add(shapes)
            return fb.static_agent(shapes)
        return fb.agent_, fb.cache_

    def infer(self, feeds: dict[str, Any]) -> list:
        if self._inference is None:
            fb = next(iter(self._fwbw.values()), None)
            model = fb.training_input_model_ if fb is not None else self.fwbw(()).training_input_model_
            self._inference = OnnxFunction(model, self.device, self.options)
        fn = self._inference
        binding = fn.bind([feeds[name] for name in fn.input_names])
        fn.run_bound(binding)
        return list(binding.get_outputs())


def _run_forward(module: OnnxModule, fb, agent_cache, tensors: Sequence[torch.Tensor]):
    """(output C OrtValues, execution state) of the training graph's forward pass on ``tensors`` (inputs then
    parameters)."""
    agent, cache = agent_cache
    values = dict(zip(module.input_names_ + module.weights_to_train_, map(_to_ort, tensors)))
    vector = OrtValueVector()
    vector.reserve(len(fb.feed_names_))
    for name in fb.feed_names_:
        vector.push_back(values[name])
    fetches = OrtValueVector()
    state = PartialGraphExecutionState()
    agent.run_forward(vector, fetches, state, cache)
    return [fetches[i] for i in range(len(module.output_names_))], state


class _OnnxFunction(torch.autograd.Function):
    """Forward through ``TrainingAgent.run_forward``, backward through ``run_backward`` with the state kept in
    ``ctx`` (so several forward passes may precede their backward passes). onnxruntime's state serves one backward
    pass: a second one (``retain_graph=True``, ``gradcheck``) runs the forward pass again on the saved tensors."""

    @staticmethod
    def forward(ctx, module: OnnxModule, fb, agent_cache, input_grads: tuple, *tensors):
        fetches, state = _run_forward(module, fb, agent_cache, tensors)
        outputs = [_to_torch(value) for value in fetches]
        ctx.module, ctx.fb, ctx.agent_cache, ctx.state = module, fb, agent_cache, state
        ctx.input_grads, ctx.dtypes = input_grads, [o.dtype for o in outputs]
        ctx.save_for_backward(*tensors)
        ctx.mark_non_differentiable(*(outputs[i] for i in fb.non_differentiable_))
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        fb = ctx.fb
        state, ctx.state = ctx.state, None
        if state is None:
            _, state = _run_forward(ctx.module, fb, ctx.agent_cache, ctx.saved_tensors)
        skipped = set(fb.non_differentiable_)
        grads = [_to_ort(grad.to(dtype)) for i, (grad, dtype) in enumerate(zip(grad_outputs, ctx.dtypes))
                 if i not in skipped]
        feeds = OrtValueVector()
        for value in grads:
            feeds.push_back(value)
        fetches = OrtValueVector()
        ctx.agent_cache[0].run_backward(feeds, fetches, state)
        by_name = {name: fetches[i] for i, name in enumerate(fb.grad_names_)}
        result = [None, None, None, None]
        for name in fb.input_names_:
            value = by_name.get(name + "_grad") if name in ctx.input_grads else None
            result.append(None if value is None else _to_torch(value))
        result.extend(_to_torch(by_name[name + "_grad"]) for name in fb.weights_to_train_)
        return tuple(result)


class OnnxModule(nn.Module):
    """An ONNX graph as a ``torch.nn.Module``, trained by torch and computed by onnxruntime.

    ``onx``: the graph (ModelProto, bytes or path). ``weights_to_train``: the float initializers that become
    ``nn.Parameter`` objects (default: all of them); the others stay constant inside the graph. Each parameter is
    named after its initializer (:func:`parameter_name` when the initializer's name is not a valid attribute name,
    see :attr:`parameter_names_`). ``forward(*inputs)`` takes one tensor per graph input, in the graph's order
    (:attr:`input_names_`), and returns one tensor, or a tuple when the graph has several outputs. Gradients reach
    the parameters and every float input that requires one.

    ``n_threads``: onnxruntime intra-op threads (default: ``torch.get_num_threads()`` when the sessions are built).
    ``static_shapes``: how many distinct input shapes get their own shape-specialized training graph (faster
    backward bookkeeping, built on first use of a shape); other shapes share one graph for any shape.

    Without gradient (``torch.no_grad()``, or nothing requiring one) the graph runs in a plain inference session.
    The graph has no training mode of its own: ``train()`` and ``eval()`` give the same values.
    """

    def __init__(self, onx, weights_to_train: Sequence[str] | None = None, n_threads: int | None = None,
                 static_shapes: int = 4):
        super().__init__()
        model = g.load_model(onx)
        g.check_loadable(model)
        self.weights_to_train_ = check_weights_to_train(model, weights_to_train)
        self.input_names_ = g.input_names(model)
        self.output_names_ = g.output_names(model)
        self.n_threads = n_threads
        self.static_shapes = int(static_shapes)
        inputs = {i.name: i for i in model.graph.input}
        self._input_specs = [self._spec(inputs[name]) for name in self.input_names_]
        inits = g.get_initializers(model)
        self.parameter_names_: dict[str, str] = {}
        taken: set[str] = set()
        for name in self.weights_to_train_:
            attr = parameter_name(name, taken)
            taken.add(attr)
            self.parameter_names_[name] = attr
            self.register_parameter(attr, nn.Parameter(torch.from_numpy(np.array(inits[name]))))
        # The graph without the trained values (torch owns them); get_trained_onnx puts them back.
        self.onnx_model_ = model
        self._runtimes: dict[str, _Runtime] = {}

    @staticmethod
    def _spec(value: onnx.ValueInfoProto) -> tuple:
        tensor = value.type.tensor_type
        dtype = _TORCH_DTYPES.get(tensor.elem_type)
        if dtype is None:
            raise UnsupportedModelError(f"input {value.name!r} has the ONNX type "
                                        f"{onnx.TensorProto.DataType.Name(tensor.elem_type)}, which torch cannot feed")
        dims = None
        if tensor.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
        return value.name, dtype, dims

    # --- torch ---
    def parameters_by_initializer(self) -> dict[str, nn.Parameter]:
        """The trained parameters by initializer name."""
        return {name: getattr(self, attr) for name, attr in self.parameter_names_.items()}

    def forward(self, *inputs: torch.Tensor):
        params = list(self.parameters_by_initializer().values())
        device = self._check_inputs(inputs, params)
        runtime = self._runtime(device)
        grad = torch.is_grad_enabled()
        input_grads = tuple(name for name, t in zip(self.input_names_, inputs)
                            if grad and t.requires_grad and t.is_floating_point())
        if not grad or not (input_grads or any(p.requires_grad for p in params)):
            feeds = {name: _to_ort(t) for name, t in zip(self.input_names_ + self.weights_to_train_,
                                                         list(inputs) + params)}
            outputs = tuple(_to_torch(v) for v in runtime.infer(feeds))
        else:
            fb = runtime.fwbw(input_grads)
            agent = runtime.agent(fb, input_grads, inputs)
            outputs = _OnnxFunction.apply(self, fb, agent, input_grads, *inputs, *params)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _check_inputs(self, inputs: Sequence[torch.Tensor], params: list[nn.Parameter]) -> torch.device:
        if len(inputs) != len(self.input_names_):
            raise TypeError(f"OnnxModule.forward takes {len(self.input_names_)} tensors {self.input_names_}, "
                            f"got {len(inputs)}")
        device = params[0].device
        for (name, dtype, dims), tensor in zip(self._input_specs, inputs):
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"input {name!r} must be a torch.Tensor, got {type(tensor).__name__}")
            if tensor.dtype != dtype:
                raise TypeError(f"input {name!r} has dtype {tensor.dtype}, the graph expects {dtype}")
            if dims is not None and (tensor.dim() != len(dims) or any(
                    d is not None and d != s for d, s in zip(dims, tensor.shape))):
                shown = ", ".join("?" if d is None else str(d) for d in dims)
                expected = f"({shown},)" if len(dims) == 1 else f"({shown})"
                raise ValueError(f"input {name!r} has shape {tuple(tensor.shape)}, the graph expects {expected} "
                                 f"(rank {len(dims)})")
            if tensor.device != device:
                raise ValueError(f"input {name!r} is on {tensor.device}, the module's parameters on {device}; "
                                 "move them to the same device")
        for name, param in self.parameters_by_initializer().items():
            init = param.dtype
            if param.device != device:
                raise ValueError(f"parameter {name!r} is on {param.device}, the others on {device}")
            expected = self._initializer_dtype(name)
            if init != expected:
                raise TypeError(f"parameter {name!r} has dtype {init}, the graph expects {expected}: the graph's "
                                "dtypes are fixed (convert the ONNX graph instead of calling .double()/.float())")
        return device

    def _initializer_dtype(self, name: str) -> torch.dtype:
        init = next(i for i in self.onnx_model_.graph.initializer if i.name == name)
        return _TORCH_DTYPES[init.data_type]

    def _runtime(self, device: torch.device) -> _Runtime:
        key = _device_string(device)
        if key not in self._runtimes:
            self._runtimes[key] = _Runtime(self, key)
        return self._runtimes[key]

    # --- export ---
    def get_trained_onnx(self) -> onnx.ModelProto:
        """The graph with the current parameter values as initializers (loadable by a plain InferenceSession)."""
        values = {name: p.detach().cpu().numpy() for name, p in self.parameters_by_initializer().items()}
        return g.replace_initializers(self.onnx_model_, values)

    def extra_repr(self) -> str:
        return f"inputs={self.input_names_}, outputs={self.output_names_}, trained={self.weights_to_train_}"

    # --- pickling: sessions are rebuilt on first use ---
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_runtimes"] = {}
        state["onnx_model_"] = self.onnx_model_.SerializeToString()
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        state["onnx_model_"] = onnx.load_from_string(state["onnx_model_"])
        super().__setstate__(state)
