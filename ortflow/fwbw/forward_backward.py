"""Forward and backward passes of an ONNX graph with onnxruntime's ``TrainingAgent``, plus the small runtime
helpers the fwbw families share (device buffers, IOBinding-run graphs, a graph builder, the family registry).

The graph given to ``OrtModuleGraphBuilder`` has its trained weights moved from initializers to inputs, as in
onnxruntime's ORTModule: the caller owns the weights (OrtValues) and feeds them at every forward pass.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .. import graph as g
from .._ort import (
    InferenceSession,
    OrtModuleGraphBuilder,
    OrtModuleGraphBuilderConfiguration,
    OrtValue,
    OrtValueCache,
    OrtValueVector,
    PartialGraphExecutionState,
    SessionOptions,
    TrainingAgent,
    captured_native_stderr,
    ort,
)
from ..exceptions import UnsupportedModelError, explain_gradient_failure
from ..validation import check_device, check_weights_to_train, device_index, resolve_device

# Pybind classes _ort does not re-export yet (OrtDevice, SessionIOBinding, TrainingGraphTransformerConfiguration,
# the C OrtValue): they live in the module onnxruntime has already imported.
_C = ort.capi._pybind_state

DEFAULT_OPSET = 17


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
    """A float32 tensor allocated once on a device. On CPU, ``array`` shares its memory with ``ortvalue``."""

    __slots__ = ("array", "device", "ortvalue", "c", "shape")

    def __init__(self, shape: Sequence[int], device: str = "cpu", value: np.ndarray | None = None):
        self.shape = tuple(int(d) for d in shape)
        self.device = device = resolve_device(device)
        kind, _ = check_device(device)
        if kind == "cpu":
            self.array = np.zeros(self.shape, dtype=np.float32)
            self.ortvalue = OrtValue.ortvalue_from_numpy(self.array)
        else:
            self.array = None
            self.ortvalue = OrtValue.ortvalue_from_shape_and_type(self.shape, np.float32, "cuda", device_index(device))
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
            self.ortvalue.update_inplace(np.ascontiguousarray(value, dtype=np.float32).reshape(self.shape))

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


# --- ONNX helpers ---------------------------------------------------------------------------------------------
class GraphBuilder:
    """Builds a small float32 ONNX graph; every constant is a Constant node (never mistaken for a weight)."""

    def __init__(self, prefix: str = "n"):
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._renamed: dict[str, str] = {}

    def input(self, name: str, shape: Sequence | None = None, elem_type: int = TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, None if shape is None else list(shape)))
        return name

    def output(self, value: str, name: str, shape: Sequence | None = None) -> str:
        """Make ``value`` a graph output called ``name``: its producing node is renamed (no Identity copy) unless
        it is a graph input or already an output."""
        value = self._renamed.get(value, value)
        producer = next((n for n in self.nodes if value in n.output), None)
        if producer is None or any(o.name == value for o in self.outputs):
            self.nodes.append(helper.make_node("Identity", [value], [name]))
        else:
            self._renamed[value] = name
            producer.output[list(producer.output).index(value)] = name
            for node in self.nodes:
                for i, used in enumerate(node.input):
                    if used == value:
                        node.input[i] = name
        dims = None if shape is None else list(shape)
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
        return name

    def node(self, op: str, inputs: Sequence[str], **attrs) -> str:
        out = f"{self.prefix}_{op.lower()}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def const(self, value, dtype=np.float32) -> str:
        out = f"{self.prefix}_cst_{len(self.nodes)}"
        array = np.asarray(value, dtype=dtype)
        self.nodes.append(helper.make_node("Constant", [], [out], value=numpy_helper.from_array(array)))
        return out

    def model(self, opset: int = DEFAULT_OPSET, name: str = "ortflow_fwbw") -> onnx.ModelProto:
        if opset < 13:
            raise ValueError(f"opset={opset}: the fwbw graphs need opset 13 or more (ReduceSum takes axes as input)")
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
        model.producer_name = "ortflow"
        if all(v.type.tensor_type.HasField("shape") for v in self.inputs + self.outputs):
            onnx.checker.check_model(model)  # the checker refuses inputs of unknown rank, onnxruntime does not
        return model


class OnnxFunction:
    """A graph run on OrtValues with IOBinding: ``run`` binds per call, ``bind`` + ``run_bound`` bind once."""

    def __init__(self, model: onnx.ModelProto, device: str = "cpu", session_options: SessionOptions | None = None):
        _, providers = check_device(device)
        self.model = model
        self.device = device = resolve_device(device)
        self.session = InferenceSession(model.SerializeToString(), session_options or quiet_options(),
                                        providers=providers)
        self._sess = self.session._sess
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

    def run_bound(self, binding) -> None:
        self._sess.run_with_iobinding(binding, None)

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


def quiet_options(n_threads: int | None = None) -> SessionOptions:
    """Session options logging errors only, with ``n_threads`` intra-op threads when given."""
    options = SessionOptions()
    options.log_severity_level = 3
    if n_threads:
        options.intra_op_num_threads = int(n_threads)
    return options


# --- registry -------------------------------------------------------------------------------------------------
class Registered:
    """Mixin registering every subclass under the short ``names`` it declares, in its family ``kind``."""

    kind: ClassVar[str] = ""
    names: ClassVar[tuple[str, ...]] = ()
    _registry: ClassVar[dict[str, dict[str, type]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        family = Registered._registry.setdefault(cls.kind, {})
        for name in cls.__dict__.get("names", ()):
            family[name] = cls


def select(kind: str, value: Any, **kwargs) -> Any:
    """An instance of family ``kind`` (``'loss'``, ``'penalty'``, ``'learning_rate'``) from an instance (returned
    as is) or a registered short name (instantiated with ``kwargs``)."""
    family = Registered._registry.get(kind)
    if family is None:
        raise ValueError(f"kind={kind!r} is not a family; families: {sorted(Registered._registry)}")
    if isinstance(value, Registered) and value.kind == kind:
        return value
    if isinstance(value, str) or value is None:
        if value not in family:
            raise ValueError(f"{kind}={value!r} is unknown; choose an instance or one of {sorted(map(str, family))}")
        return family[value](**kwargs)
    raise TypeError(f"{kind}={value!r} must be a registered name or an instance of a {kind} class")


# --- forward / backward ---------------------------------------------------------------------------------------
class OrtGradientForwardBackward:
    """Forward and backward passes of ``model_onnx`` through onnxruntime's ``TrainingAgent``.

    ``weights_to_train`` (default: every float initializer) become inputs of the training graph; the object keeps
    their current values in ``weights`` (name -> OrtValue). ``forward(inputs, training=True)`` keeps the execution
    state that ``backward(grad_outputs)`` consumes; ``backward`` returns the gradients of ``input_names_to_train``
    then of the weights, in the order of ``grad_names_``. On CPU, Relu nodes are trained as ``x * (x > 0)``
    (:func:`ortflow.graph.relu_as_mask`).
    """

    def __init__(
        self,
        model_onnx,
        weights_to_train: Sequence[str] | None = None,
        input_names_to_train: Sequence[str] | None = None,
        device: str = "cpu",
        session_options: SessionOptions | None = None,
    ):
        model = g.load_model(model_onnx)
        g.check_loadable(model)
        check_device(device)
        self.device = device = resolve_device(device)
        self.weights_to_train_ = check_weights_to_train(model, weights_to_train)
        self.input_names_ = g.input_names(model)
        self.input_names_to_train_ = list(input_names_to_train or [])
        unknown = [n for n in self.input_names_to_train_ if n not in self.input_names_]
        if unknown:
            raise ValueError(f"input_names_to_train names {unknown}, which are not inputs; inputs: {self.input_names_}")
        self.output_names_ = g.output_names(model)
        self.model_ = model
        self.training_input_model_ = self._weights_as_inputs(model)
        self._build(session_options)
        inits = g.get_initializers(model)
        self._dtypes = {name: inits[name].dtype for name in self.weights_to_train_}
        self._shapes = {name: inits[name].shape for name in self.weights_to_train_}
        self.weights = {name: to_ortvalue(inits[name], device) for name in self.weights_to_train_}
        self._state = None

    def _weights_as_inputs(self, model: onnx.ModelProto) -> onnx.ModelProto:
        new = onnx.ModelProto()
        if check_device(self.device)[0] == "cpu":
            model = g.relu_as_mask(model)
        new.CopyFrom(model)
        for i, node in enumerate(new.graph.node):  # named nodes, so a missing gradient names its node
            if not node.name:
                node.name = f"{node.op_type}_{i}"
        trained = set(self.weights_to_train_)
        declared = {i.name for i in new.graph.input}
        kept = []
        for init in new.graph.initializer:
            if init.name in trained:
                if init.name not in declared:
                    new.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
            else:
                kept.append(init)
        del new.graph.initializer[:]
        new.graph.initializer.extend(kept)
        return new

    def _build(self, session_options: SessionOptions | None) -> None:
        self._session_options = session_options or quiet_options()
        self._sessions: list[InferenceSession] = []  # the agents hold the C sessions only
        self.agent_, self.cache_, self.gradient_model_, builder = self._build_agent(None, self._session_options)
        self._sess = self._sessions[0]
        self.forward_model_ = onnx.load_from_string(builder.get_forward_model())
        info = builder.get_graph_info()
        self.graph_info_ = info
        missing = [w for w in self.weights_to_train_ if w + "_grad" not in info.initializer_grad_names_to_train]
        grad_outputs = {o.name for o in self.gradient_model_.graph.output}
        if missing or not all(w + "_grad" in grad_outputs for w in self.weights_to_train_):
            raise UnsupportedModelError(
                f"onnxruntime built no gradient for weights {missing or self.weights_to_train_}")
        self.feed_names_ = [i.name for i in self.gradient_model_.graph.input]
        self.grad_names_ = [o.name for o in self.gradient_model_.graph.output]
        self.non_differentiable_ = list(info.output_grad_indices_non_differentiable)
        self._static: dict[tuple, tuple] = {}

    def _build_agent(self, input_shapes: list[list[int]] | None, options: SessionOptions):
        """(TrainingAgent, OrtValueCache, training graph, builder) for inputs of any shape (``None``) or of
        exactly ``input_shapes``, in a session with ``options``."""
        config = OrtModuleGraphBuilderConfiguration()
        config.initializer_names = list(self.weights_to_train_)
        config.initializer_names_to_train = list(self.weights_to_train_)
        config.input_names_require_grad = list(self.input_names_to_train_)
        config.build_gradient_graph = True
        builder = OrtModuleGraphBuilder()
        try:
            with captured_native_stderr():
                builder.initialize(self.training_input_model_.SerializeToString(), config)
                if input_shapes is None:
                    builder.build(_C.TrainingGraphTransformerConfiguration())
                else:
                    builder.build(_C.TrainingGraphTransformerConfiguration(), input_shapes)
        except RuntimeError as exc:
            raise explain_gradient_failure(exc) from exc
        model = g.fused_matmul_for_double(onnx.load_from_string(builder.get_gradient_model()))
        _, providers = check_device(self.device)
        sess = InferenceSession(model.SerializeToString(), options, providers=providers)
        self._sessions.append(sess)
        info = builder.get_graph_info()
        dev = ort_device(self.device)
        n_fw = len(info.user_output_names) + len(info.frontier_node_arg_map)
        grads = [o.name for o in model.graph.output]
        agent = TrainingAgent(sess._sess, [i.name for i in model.graph.input], [dev] * n_fw, grads,
                              [dev] * len(grads), 0)
        return agent, OrtValueCache(), model, builder

    def static_agent(self, input_shapes: Sequence[Sequence[int]], session_options: SessionOptions | None = None
                     ) -> tuple:
        """(TrainingAgent, OrtValueCache) of a training graph built for inputs of exactly ``input_shapes`` (one
        per model input). Knowing the shapes, onnxruntime resolves the broadcast bookkeeping of the backward
        pass (Shape, BroadcastGradientArgs, Reshape nodes) when it builds the graph instead of at every batch:
        a third less time per batch on an MLP at batch 15 (docs/PERFORMANCE.md). Built once per shape; feeds
        and fetches are ordered as for :attr:`agent_`; ``session_options`` (default: those of :attr:`agent_`) apply
        to the first call for a shape. Falls back to :attr:`agent_` (reason in ``static_failures_``) when
        onnxruntime cannot build the graph for these shapes."""
        key = tuple(tuple(int(d) for d in shape) for shape in input_shapes)
        if len(key) != len(self.input_names_):
            raise ValueError(f"static_agent expects {len(self.input_names_)} shapes {self.input_names_}, got {key}")
        if key not in self._static:
            try:
                agent, cache, model, _ = self._build_agent([list(shape) for shape in key],
                                                           session_options or self._session_options)
                if ([i.name for i in model.graph.input] != self.feed_names_
                        or [o.name for o in model.graph.output] != self.grad_names_):
                    raise UnsupportedModelError("the training graph for static shapes has other inputs or outputs")
                self._static[key] = (agent, cache, model)
            except (RuntimeError, UnsupportedModelError) as exc:
                self.static_failures_ = {**getattr(self, "static_failures_", {}), key: str(exc)}
                self._static[key] = (self.agent_, self.cache_, None)
        agent, cache, _ = self._static[key]
        return agent, cache

    # --- weights ---
    def get_weights(self) -> dict[str, np.ndarray]:
        """Current weights as numpy copies."""
        return {name: value.numpy() for name, value in self.weights.items()}

    def set_weights(self, values: Mapping[str, Any]) -> None:
        """Replace weights by OrtValues (used as they are) or arrays (copied to the device)."""
        for name, value in values.items():
            if name not in self.weights:
                raise KeyError(f"set_weights: {name!r} is not a trained weight; trained: {self.weights_to_train_}")
            if isinstance(value, DeviceBuffer):
                value = value.ortvalue
            elif not isinstance(value, OrtValue):
                array = np.array(value, dtype=self._dtypes[name])
                if array.shape != self._shapes[name]:
                    raise ValueError(f"set_weights: {name!r} has shape {self._shapes[name]}, the value {array.shape}")
                value = to_ortvalue(array, self.device)
            self.weights[name] = value

    # --- passes ---
    def feed_vector(self, inputs: Mapping[str, Any]) -> OrtValueVector:
        """An OrtValueVector in feed order from ``inputs`` (name -> OrtValue/DeviceBuffer/C OrtValue)."""
        vector = OrtValueVector()
        vector.reserve(len(self.feed_names_))
        for name in self.feed_names_:
            vector.push_back(_c_value(inputs[name]))
        return vector

    def forward(self, inputs: Sequence[Any], training: bool = False) -> list[OrtValue]:
        """Outputs (OrtValues) for ``inputs`` (one per graph input, arrays or OrtValues) and the current weights.

        With ``training=True`` the execution state is kept for the next :meth:`backward`."""
        if len(inputs) != len(self.input_names_):
            raise ValueError(f"forward expects {len(self.input_names_)} inputs {self.input_names_}, got {len(inputs)}")
        feeds = dict(zip(self.input_names_, (to_ortvalue(v, self.device) for v in inputs)))
        feeds.update(self.weights)
        fetches = OrtValueVector()
        state = PartialGraphExecutionState()
        self.agent_.run_forward(self.feed_vector(feeds), fetches, state, self.cache_)
        self._state = state if training else None
        return [OrtValue(fetches[i]) for i in range(len(self.output_names_))]

    def backward(self, grad_outputs: Sequence[Any]) -> list[OrtValue]:
        """Gradients (OrtValues, order ``grad_names_``) given the gradient of the loss w.r.t. each output."""
        if self._state is None:
            raise RuntimeError("backward needs a preceding forward(inputs, training=True)")
        expected = len(self.output_names_) - len(self.non_differentiable_)
        if len(grad_outputs) != expected:
            raise ValueError(f"backward expects {expected} output gradients, got {len(grad_outputs)}")
        values = [to_ortvalue(v, self.device) for v in grad_outputs]  # referenced: they own their memory
        feeds = OrtValueVector()
        for value in values:
            feeds.push_back(_c_value(value))
        fetches = OrtValueVector()
        state, self._state = self._state, None
        self.agent_.run_backward(feeds, fetches, state)
        return [OrtValue(fetches[i]) for i in range(len(self.grad_names_))]

    # --- export ---
    def backward_model(self) -> onnx.ModelProto:
        """The backward part of the training graph (the nodes after ``YieldOp``) as a standalone graph, for reading:
        its inputs are the output gradients and the forward tensors it reuses."""
        return _backward_part(self.gradient_model_)

    def optimized_model(self) -> onnx.ModelProto:
        """The training graph after onnxruntime's graph optimizations (what the session runs)."""
        with tempfile.TemporaryDirectory(prefix="ortflow-opt-") as folder:
            path = os.path.join(folder, "optimized.onnx")
            options = quiet_options()
            options.optimized_model_filepath = path
            _, providers = check_device(self.device)
            InferenceSession(self.gradient_model_.SerializeToString(), options, providers=providers)
            return onnx.load(path)

    def graphs(self) -> dict[str, onnx.ModelProto]:
        """Every graph: the model with weights as inputs, forward, training (forward + backward), backward,
        optimized, and ``training_<rows>`` per static training graph built by :meth:`static_agent`."""
        graphs = {
            "model": self.training_input_model_,
            "forward": self.forward_model_,
            "training": self.gradient_model_,
            "backward": self.backward_model(),
            "optimized": self.optimized_model(),
        }
        for key, (_, _, model) in self._static.items():
            if model is not None:
                graphs["training_" + "_".join("x".join(map(str, shape)) for shape in key)] = model
        return graphs

    def save_onnx_graph(self, folder: str | os.PathLike) -> dict[str, str]:
        """Write :meth:`graphs` into ``folder`` as ``<name>.onnx``; return name -> path."""
        os.makedirs(folder, exist_ok=True)
        paths = {}
        for name, model in self.graphs().items():
            path = g.safe_join(folder, f"{name}.onnx")
            onnx.save(model, str(path))
            paths[name] = str(path)
        return paths


def _backward_part(model: onnx.ModelProto) -> onnx.ModelProto:
    nodes = list(model.graph.node)
    yields = [i for i, n in enumerate(nodes) if n.op_type == "YieldOp"]
    if not yields:
        raise UnsupportedModelError("the training graph has no YieldOp: no backward part to extract")
    after = set()
    backward = []
    for node in nodes[yields[0]:]:
        if node.op_type == "YieldOp" or after.intersection(node.input):
            backward.append(node)
            after.update(node.output)
    produced = set().union(*(n.output for n in backward)) if backward else set()
    inits = {i.name: i for i in model.graph.initializer}
    needed = []
    for node in backward:
        for name in node.input:
            if name and name not in produced and name not in inits and name not in needed:
                needed.append(name)
    typed = {v.name: v for v in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output)}
    inputs = [typed.get(n) or helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in needed]
    used_inits = [inits[n] for n in {i for node in backward for i in node.input} if n in inits]
    graph = helper.make_graph(backward, "backward", inputs, list(model.graph.output), used_inits)
    new = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    new.producer_name = "ortflow"
    return new
