"""An ONNX graph as a PyTorch layer: :class:`OnnxModule`.

The forward and backward passes run in onnxruntime (``TrainingAgent``, or ortflow's own graphs on the plain build,
through :class:`ortflow.trainers.fwbw.OrtGradientForwardBackward`, whose training graph takes the trained weights as inputs);
torch owns the weights as ``nn.Parameter`` objects, so its optimizers, LR schedulers, ``state_dict`` and pickling apply.

Tensors cross between torch and onnxruntime through DLPack. Per batch, when the inputs and the output gradients
are contiguous tensors of the graph's dtype on the module's device, the inputs and the parameters are viewed as
OrtValues and onnxruntime allocates the gradients, which torch views; the one copy is of the outputs in training
(batch x outputs values): onnxruntime's backward pass reuses their buffers. A non-contiguous tensor (a strided
slice, an expanded gradient such as the one of ``y.sum()``) is copied once by ``.contiguous()``, since onnxruntime
reads dense row-major buffers only.

This module needs torch (``pip install 'ortflow[torch]'``); ``import ortflow`` does not import it.
"""

from __future__ import annotations

import keyword
import operator
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("ortflow.torch needs PyTorch: pip install 'ortflow[torch]' (torch==2.13.0, CPU build)") from exc
from torch import nn
from torch.utils.dlpack import to_dlpack

# What torch.utils.dlpack.from_dlpack calls for a capsule, without its Python checks (onnxruntime's ORTModule
# passes the same function to OrtValueVector.to_dlpacks).
_from_dlpack = getattr(torch._C, "_from_dlpack", torch.utils.dlpack.from_dlpack)

from .graph import editing as g
from ._ort import _C, TRAINING, OrtValueVector, SessionOptions
from .exceptions import UnsupportedModelError
from .engines.forward_backward import OrtGradientForwardBackward
from .runtime.sessions import OnnxFunction, make_session_options, threads_for_work
from .runtime.placement import Placement
from .runtime.validation import check_weights_to_train

#: who builds the layer's gradient graphs: onnxruntime's TrainingAgent on the training build (its per-shape agents
#: and buffer reuse are what the layer's DLPack path is built around), ortflow's graphs on the plain build
LAYER_GRADIENTS = "onnxruntime" if TRAINING else "ortflow"

__all__ = ["OnnxModule", "RuleOptimizer", "parameter_name"]

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


def _capsule(tensor: torch.Tensor):
    """A DLPack capsule viewing ``tensor`` (made contiguous first when it is not: onnxruntime reads dense buffers)."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return to_dlpack(tensor)


# onnxruntime-training 1.19's from_dlpack takes an is_bool flag (its DLPack marks booleans as uint8); the plain
# onnxruntime's reads the type from the capsule and takes the capsule alone.
_DLPACK_BOOL_FLAG = "is_bool" in (_C.OrtValue.from_dlpack.__doc__ or "")


def _to_ort(tensor: torch.Tensor):
    """A C OrtValue viewing ``tensor``."""
    if _DLPACK_BOOL_FLAG:
        return _C.OrtValue.from_dlpack(_capsule(tensor), tensor.dtype == torch.bool)
    return _C.OrtValue.from_dlpack(_capsule(tensor))


def _bool_indices(vector: OrtValueVector) -> list[int]:
    """Positions of the boolean tensors of ``vector``."""
    if hasattr(vector, "bool_tensor_indices"):  # onnxruntime-training 1.19
        return vector.bool_tensor_indices()
    return [i for i in range(len(vector)) if vector.element_type_at(i) == onnx.TensorProto.BOOL]


def _vector(tensors: Sequence[torch.Tensor], values: Sequence = ()) -> OrtValueVector:
    """An OrtValueVector viewing ``tensors`` then holding the C OrtValues ``values``."""
    vector = OrtValueVector()
    vector.reserve(len(tensors) + len(values))
    for tensor in tensors:
        if _DLPACK_BOOL_FLAG:
            vector.push_back(_capsule(tensor), tensor.dtype == torch.bool)
        else:
            vector.push_back(_capsule(tensor))
    for value in values:
        vector.push_back(value)
    return vector


def _to_torch(vector: OrtValueVector, bools: Sequence[int] | None = None) -> list[torch.Tensor]:
    """Torch tensors viewing every OrtValue of ``vector`` (one C++ call; the tensors own the values). ``bools``:
    the positions of the boolean tensors when the caller knows them (else they are looked up)."""
    tensors = vector.to_dlpacks(_from_dlpack)
    for i in _bool_indices(vector) if bools is None else bools:  # DLPack may carry booleans as uint8
        tensors[i] = tensors[i].to(torch.bool)
    return tensors


def _synchronize(device: torch.device) -> None:
    """On CUDA, wait for the device: torch and onnxruntime work on different streams, so the tensors one writes
    must be complete before the other reads them (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def torch_precision() -> str:
    """torch's own float32 matrix-product precision as ortflow's (``'fp32'`` or ``'tf32'``): TF32 when
    ``torch.backends.cuda.matmul.allow_tf32`` is set or ``torch.set_float32_matmul_precision`` asked for 'high' or
    'medium'. A layer reads it when it first runs on a device, for the sessions it builds there."""
    if torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "fp32"


def _device_string(device: torch.device) -> str:
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return f"cuda:{device.index or 0}"
    raise ValueError(f"OnnxModule runs on cpu or cuda tensors, not {device}")


def _output_dtypes(model: onnx.ModelProto) -> list[torch.dtype | None]:
    """The torch dtype of each graph output (None for a type torch has no dtype for)."""
    return [_TORCH_DTYPES.get(o.type.tensor_type.elem_type) for o in model.graph.output]


class _Runtime:
    """The onnxruntime side of an :class:`OnnxModule` on one device: one forward-backward object per set of
    inputs needing a gradient (built on first use), their static-shape agents, and an inference function."""

    def __init__(self, module: OnnxModule, device: torch.device):
        self.module = module
        self.torch_device = device
        self.device = _device_string(device)
        # torch's own float32 precision, read when the layer first runs on the device, for its sessions there
        self.placement = Placement.of(self.device, torch_precision())
        self.threads = module.n_threads or torch.get_num_threads()
        self.options = self._options(self.threads)
        self._small_batch_options: SessionOptions | None = None
        self._param_views: list = [None] * len(module.weights_to_train_)
        self._param_pointers: list[int | None] = [None] * len(module.weights_to_train_)
        self._plans: dict[tuple[str, ...], _Plan] = {}
        self._calls: dict[tuple, tuple[_Plan, tuple]] = {}
        self._n_static: dict[tuple[str, ...], int] = {}
        self._inference: OnnxFunction | None = None

    def _options(self, threads: int) -> SessionOptions:
        options = make_session_options(threads)
        # torch's and onnxruntime's thread pools take turns on the same cores: a pool spinning while it waits
        # for work steals them from the other (4x slower batches on case A of the bench with 2 threads each).
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if self.module.spinning else "0")
        return options

    def static_options(self, shapes: tuple) -> SessionOptions | None:
        """The options of the static-shape agent for these input shapes: one thread for a batch whose work
        (rows x float weights) is under :data:`ortflow.runtime.sessions.THREADS_WORK_THRESHOLD` unless ``n_threads`` was
        given (waking a second thread for each small node costs more than it saves, and torch does not split such
        ops either), else the runtime's options."""
        rows = shapes[0][0] if shapes and len(shapes[0]) else 1
        if (self.module.n_threads is not None or self.threads == 1
                or threads_for_work(rows, self.module._n_weights, self.device) > 1):
            return None
        if self._small_batch_options is None:
            self._small_batch_options = self._options(1)
        return self._small_batch_options

    def plan(self, inputs_with_grad: tuple[str, ...]) -> _Plan:
        """The plan of the forward-backward object computing the gradients of ``inputs_with_grad`` and of the
        parameters (built on first use)."""
        plan = self._plans.get(inputs_with_grad)
        if plan is None:
            fb = OrtGradientForwardBackward(
                self.module.onnx_model_, weights_to_train=self.module.weights_to_train_,
                input_names_to_train=list(inputs_with_grad), device=self.placement, session_options=self.options,
                gradients=LAYER_GRADIENTS)
            plan = self._plans[inputs_with_grad] = _Plan(self.module, fb, inputs_with_grad, self.torch_device)
        return plan

    def call(self, inputs_with_grad: tuple[str, ...], shapes: tuple) -> tuple[_Plan, tuple]:
        """(plan, (agent, cache)) for these inputs needing a gradient and these input shapes: the static-shape
        agent while fewer than ``static_shapes`` exist for the plan, else the plan's agent for any shape."""
        key = (inputs_with_grad, shapes)
        found = self._calls.get(key)
        if found is None:
            plan = self.plan(inputs_with_grad)
            n_static = self._n_static.get(inputs_with_grad, 0)
            if n_static < self.module.static_shapes:
                self._n_static[inputs_with_grad] = n_static + 1
                found = plan, plan.fb.static_agent(tuple(tuple(shape) for shape in shapes),
                                                   self.static_options(shapes))
                self._calls[key] = found
            else:  # not kept: an unbounded number of shapes may come
                found = plan, (plan.fb.agent_, plan.fb.cache_)
        return found

    def param_views(self, params: Sequence[torch.Tensor], device: torch.device) -> list:
        """C OrtValues viewing the parameters, kept while the parameters' storages stay where they are (optimizers
        and ``load_state_dict`` write in place): a DLPack export costs a few microseconds per tensor and batch. A
        parameter is checked (device, dtype) when its storage moves, which ``.to()`` and ``.double()`` do. The
        list returned is never changed afterwards (a move makes a new one)."""
        pointers = [param.data_ptr() for param in params]
        if pointers != self._param_pointers:
            views = list(self._param_views)
            for i, (param, pointer) in enumerate(zip(params, pointers)):
                if pointer != self._param_pointers[i]:
                    self.module._check_parameter(i, param, device)
                    views[i] = _to_ort(param)
            self._param_views, self._param_pointers = views, pointers
        return self._param_views

    def infer(self, feeds: dict[str, Any], device: torch.device) -> list:
        if self._inference is None:
            plan = next(iter(self._plans.values()), None) or self.plan(())
            model = plan.fb.training_input_model_
            self._inference = OnnxFunction(model, self.placement, self.options)
        fn = self._inference
        binding = fn.bind([feeds[name] for name in fn.input_names])
        _synchronize(device)
        fn.run_bound(binding)
        _synchronize(device)
        return binding.get_outputs()


class _Plan:
    """Where the module's tensors sit in the feeds and fetches of one forward-backward object, and what its
    forward and backward passes need on each call (computed once)."""

    def __init__(self, module: OnnxModule, fb: OrtGradientForwardBackward, input_grads: tuple[str, ...],
                 device: torch.device):
        if fb.feed_names_ != module.feed_names_:  # OrtGradientForwardBackward puts the weights after the inputs
            raise UnsupportedModelError(f"the training graph's inputs {fb.feed_names_} are not the graph inputs "
                                        f"then the trained weights {module.feed_names_}")
        position = {name: i for i, name in enumerate(fb.grad_names_)}
        self.fb = fb
        self.device = device
        self.cuda = device.type == "cuda"
        self.n_inputs = len(module.input_names_)
        self.n_outputs = len(module.output_names_)
        self.output_dtypes = module._output_dtypes
        self.output_bools = [i for i, dtype in enumerate(self.output_dtypes) if dtype == torch.bool]
        self.non_differentiable = set(fb.non_differentiable_)
        # what backward returns for (plan, agent_cache, param_views, *inputs, *parameters): None for the first
        # three, then the position of each gradient among the fetches of run_backward (None: no gradient)
        self.grad_positions = [None, None, None,
                               *(position[name + "_grad"] if name in input_grads else None
                                 for name in module.input_names_),
                               *(position[name + "_grad"] for name in module.weights_to_train_)]

    def run_forward(self, agent_cache: tuple, tensors: Sequence[torch.Tensor], param_views: Sequence) -> tuple:
        """(output tensors, execution state) of the training graph's forward pass on the inputs ``tensors``."""
        agent, cache = agent_cache
        fetches = OrtValueVector()
        state = self.fb.new_state()  # onnxruntime's PartialGraphExecutionState, or ortflow's own graphs' state
        feeds = _vector(tensors, param_views)
        if self.cuda:
            _synchronize(self.device)
        agent.run_forward(feeds, fetches, state, cache)
        if self.cuda:
            _synchronize(self.device)
        return _to_torch(fetches, self.output_bools)[: self.n_outputs], state


class _OnnxFunction(torch.autograd.Function):
    """Forward through ``TrainingAgent.run_forward``, backward through ``run_backward`` with the state kept in
    ``ctx`` (so several forward passes may precede their backward passes). onnxruntime's state serves one backward
    pass: a second one (``retain_graph=True``, ``gradcheck``) runs the forward pass again on the saved tensors."""

    @staticmethod
    def forward(ctx, plan: _Plan, agent_cache: tuple, param_views: list, *tensors):
        outputs, state = plan.run_forward(agent_cache, tensors[: plan.n_inputs], param_views)
        # onnxruntime's memory plan lets the backward pass reuse the buffers of the forward outputs: the outputs
        # handed to torch are copies (batch x outputs values), or they would change under the caller at backward
        outputs = [o.clone() for o in outputs]
        # the tensors are kept for a second backward pass only (retain_graph, gradcheck), with their versions to
        # refuse tensors changed in place since: save_for_backward's bookkeeping costs microseconds per tensor
        ctx.run = [plan, agent_cache, state, tensors, [t._version for t in tensors]]
        if plan.non_differentiable:
            ctx.mark_non_differentiable(*(outputs[i] for i in plan.non_differentiable))
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        run = ctx.run
        plan, agent_cache, state, tensors, versions = run
        run[2] = None
        if state is None:
            changed = [i for i, (t, v) in enumerate(zip(tensors, versions)) if t._version != v]
            if changed:
                raise RuntimeError(f"OnnxModule: a second backward pass needs the forward pass's tensors, but "
                                   f"tensors {changed} (inputs, then parameters) were modified in place since")
            views = [_to_ort(t) for t in tensors[plan.n_inputs:]]
            _, state = plan.run_forward(agent_cache, tensors[: plan.n_inputs], views)
        grads = [grad if grad.dtype == dtype or dtype is None else grad.to(dtype)
                 for grad, dtype in zip(grad_outputs, plan.output_dtypes)]
        if plan.non_differentiable:
            grads = [grad for i, grad in enumerate(grads) if i not in plan.non_differentiable]
        fetches = OrtValueVector()
        feeds = _vector(grads)
        if plan.cuda:
            _synchronize(plan.device)
        agent_cache[0].run_backward(feeds, fetches, state)
        if plan.cuda:
            _synchronize(plan.device)
        fetched = fetches.to_dlpacks(_from_dlpack)  # gradients are float tensors: no boolean to convert
        return tuple(None if i is None else fetched[i] for i in plan.grad_positions)


# Function.apply's Python wrapper (signature binding, functorch checks) costs about 6 µs per call: without an
# active functorch transform (vmap, grad...) the module calls the C implementation the wrapper ends in.
_apply_c = super(torch.autograd.Function, _OnnxFunction).apply
_unwrap_if_dead = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)


def _apply(plan: _Plan, agent_cache: tuple, param_views: list, inputs: Sequence[torch.Tensor],
           params: Sequence[torch.Tensor]) -> tuple:
    if _unwrap_if_dead is None or torch._C._are_functorch_transforms_active():
        return _OnnxFunction.apply(plan, agent_cache, param_views, *inputs, *params)
    if len(inputs) == 1:
        return _apply_c(plan, agent_cache, param_views, _unwrap_if_dead(inputs[0]), *params)
    return _apply_c(plan, agent_cache, param_views, *map(_unwrap_if_dead, inputs), *params)


class OnnxModule(nn.Module):
    """An ONNX graph as a ``torch.nn.Module``, trained by torch and computed by onnxruntime.

    ``onx``: the graph (ModelProto, bytes or path). ``weights_to_train``: the float initializers that become
    ``nn.Parameter`` objects (default: all of them); the others stay constant inside the graph. Each parameter is
    named after its initializer (:func:`parameter_name` when the initializer's name is not a valid attribute name,
    see :attr:`parameter_names_`). ``forward(*inputs)`` takes one tensor per graph input, in the graph's order
    (:attr:`input_names_`), and returns one tensor, or a tuple when the graph has several outputs. Gradients reach
    the parameters and every float input that requires one.

    ``n_threads``: onnxruntime intra-op threads (default: ``torch.get_num_threads()`` when the sessions are built,
    and one for the shape-specialized graph of a batch too small to split, rows x float weights under
    :data:`ortflow.runtime.sessions.THREADS_WORK_THRESHOLD`).
    ``static_shapes``: how many distinct input shapes get their own shape-specialized training graph (faster
    backward bookkeeping, built on first use of a shape); other shapes share one graph for any shape.
    ``spinning``: let onnxruntime's idle threads spin (off by default: they would take the cores from torch's).

    Without gradient (``torch.no_grad()``, or nothing requiring one) the graph runs in a plain inference session.
    The graph has no training mode of its own: ``train()`` and ``eval()`` give the same values.
    """

    def __init__(self, onx, weights_to_train: Sequence[str] | None = None, n_threads: int | None = None,
                 static_shapes: int = 4, spinning: bool = False):
        super().__init__()
        model = g.load_model(onx)
        g.check_loadable(model)
        self.weights_to_train_ = check_weights_to_train(model, weights_to_train)
        self.input_names_ = g.input_names(model)
        self.output_names_ = g.output_names(model)
        self.feed_names_ = self.input_names_ + self.weights_to_train_
        self.n_threads = n_threads
        self.static_shapes = int(static_shapes)
        self.spinning = bool(spinning)
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
        self._param_dtypes = [p.dtype for p in self._parameters.values()]
        self._output_dtypes = _output_dtypes(model)
        self._n_weights = g.float_weight_count(model)
        # The graph without the trained values (torch owns them); get_trained_onnx puts them back.
        self.onnx_model_ = model
        self._runtimes: dict[torch.device, _Runtime] = {}

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
        # the declared dimensions: an itemgetter reading them from a shape, and their values
        known = [(i, d) for i, d in enumerate(dims or ()) if d is not None]
        fixed = operator.itemgetter(*(i for i, _ in known)) if known else None
        values = fixed(tuple(d or 0 for d in dims)) if known else None
        return value.name, dtype, dims, fixed, values

    # --- torch ---
    def parameters_by_initializer(self) -> dict[str, nn.Parameter]:
        """The trained parameters by initializer name."""
        return {name: getattr(self, attr) for name, attr in self.parameter_names_.items()}

    def forward(self, *inputs: torch.Tensor):
        params = list(self._parameters.values())
        device = params[0].device
        shapes = self._check_inputs(inputs, device)
        runtime = self._runtimes.get(device) or self._runtime(device)
        views = runtime.param_views(params, device)
        if torch.is_grad_enabled():
            input_grads = ()
            for name, tensor in zip(self.input_names_, inputs):
                if tensor.requires_grad and tensor.is_floating_point():
                    input_grads += (name,)
            if input_grads or params[0].requires_grad or any(p.requires_grad for p in params):
                plan, agent = runtime.call(input_grads, shapes)
                outputs = _apply(plan, agent, views, inputs, params)
                return outputs[0] if len(outputs) == 1 else outputs
        feeds = dict(zip(self.feed_names_, [_to_ort(t) for t in inputs] + views))
        outputs = _to_torch(runtime.infer(feeds, device))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _check_inputs(self, inputs: Sequence[torch.Tensor], device: torch.device) -> tuple:
        """The inputs' shapes, once their number, types, dtypes, shapes and device are checked."""
        if len(inputs) != len(self.input_names_):
            raise TypeError(f"OnnxModule.forward takes {len(self.input_names_)} tensors {self.input_names_}, "
                            f"got {len(inputs)}")
        shapes = []
        for (name, dtype, dims, fixed, values), tensor in zip(self._input_specs, inputs):
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"input {name!r} must be a torch.Tensor, got {type(tensor).__name__}")
            if tensor.dtype != dtype:
                raise TypeError(f"input {name!r} has dtype {tensor.dtype}, the graph expects {dtype}")
            shape = tensor.shape
            if dims is not None and (len(shape) != len(dims) or fixed is not None and fixed(shape) != values):
                shown = ", ".join("?" if d is None else str(d) for d in dims)
                expected = f"({shown},)" if len(dims) == 1 else f"({shown})"
                raise ValueError(f"input {name!r} has shape {tuple(shape)}, the graph expects {expected} "
                                 f"(rank {len(dims)})")
            if tensor.device != device:
                raise ValueError(f"input {name!r} is on {tensor.device}, the module's parameters on {device}; "
                                 "move them to the same device")
            shapes.append(shape)
        return tuple(shapes)

    def _check_parameter(self, index: int, param: torch.Tensor, device: torch.device) -> None:
        name, expected = self.weights_to_train_[index], self._param_dtypes[index]
        if param.device != device:
            raise ValueError(f"parameter {name!r} is on {param.device}, the others on {device}")
        if param.dtype != expected:
            raise TypeError(f"parameter {name!r} has dtype {param.dtype}, the graph expects {expected}: the "
                            "graph's dtypes are fixed (convert the ONNX graph instead of calling .double())")

    def _runtime(self, device: torch.device) -> _Runtime:
        if device not in self._runtimes:
            self._runtimes[device] = _Runtime(self, device)
        return self._runtimes[device]

    # --- export ---
    def get_trained_onnx(self) -> onnx.ModelProto:
        """The graph with the current parameter values as initializers (loadable by a plain InferenceSession)."""
        values = {name: p.detach().cpu().numpy() for name, p in self.parameters_by_initializer().items()}
        return g.replace_initializers(self.onnx_model_, values)

    def training_graphs(self) -> dict[str, onnx.ModelProto]:
        """The forward-backward graphs onnxruntime built so far on the first device used: ``training`` (and
        ``training_grad_<inputs>`` when gradients of some inputs were asked for), for reading or logging."""
        graphs = {}
        for runtime in list(self._runtimes.values())[:1]:
            for key, plan in runtime._plans.items():
                graphs["_".join(["training", *(["grad"] if key else []), *key])] = plan.fb.gradient_model_
        return graphs

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


class RuleOptimizer(torch.optim.Optimizer):
    """A torch optimizer running an ortflow optimizer's update rule (:mod:`ortflow.optimizers.learning_rates`: the rule written
    once, here on torch tensors), so a torch loop trains exactly as ortflow's trainers do:
    ``RuleOptimizer(model.parameters(), ortflow.LearningRateAdamW(eta0=0.01))``. ``lr`` (per parameter group, default
    the schedule's first value) is the rule's ``learning_rate``: torch's LR schedulers change it; ``state[p]`` holds
    the rule's slots and the step count."""

    def __init__(self, params, rate, lr: float | None = None):
        rate.check()
        self.rate = rate
        super().__init__(params, {"lr": float(rate.value_at(0) if lr is None else lr)})

    @torch.no_grad()
    def step(self, closure=None):
        from .optimizers.learning_rates import ArrayOps

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        slots = self.rate.slots[1:]
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state.update({slot: torch.zeros_like(p) for slot in slots})
                state["step"] += 1
            # one step number per group: its parameters start together
            # float32 scalars, as the graphs compute them
            step = np.float32(float(self.state[params[0]]["step"]))
            given = {i: (p, p.grad, {slot: self.state[p][slot] for slot in slots}) for i, p in enumerate(params)}
            new = self.rate.write_update(ArrayOps(np.float32), given, np.float32(group["lr"]), step)
            for i, p in enumerate(params):
                p.copy_(new[i]["weight"])
                for slot in slots:
                    self.state[p][slot] = new[i][slot]
        return loss
