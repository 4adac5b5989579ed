"""Forward and backward passes of an ONNX graph with onnxruntime's ``TrainingAgent``.

The graph given to ``OrtModuleGraphBuilder`` has its trained weights moved from initializers to inputs, as in
onnxruntime's ORTModule: the caller owns the weights (OrtValues) and feeds them at every forward pass.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..graph import editing as g
from .._ort import (TRAINING, _C, InferenceSession, OrtModuleGraphBuilder, OrtModuleGraphBuilderConfiguration, OrtValue,
                    OrtValueCache, OrtValueVector, PartialGraphExecutionState, SessionOptions, TrainingAgent,
                    captured_native_stderr, require_training)
from ..exceptions import (NotDifferentiableError, UnsupportedModelError, explain_gradient_failure,
                          with_training_build_hint)
from ..runtime.sessions import (DeviceBuffer, _c_value, c_session, make_session, make_session_options, ort_device,
                                to_ortvalue)
from ..runtime.placement import Placement
from ..runtime.validation import check_choice, check_weights_to_train
from .own_graphs import ForwardState, build_own_graphs, free_inputs


# --- forward / backward ---------------------------------------------------------------------------------------
class OrtGradientForwardBackward:
    """Forward and backward passes of ``model_onnx`` through onnxruntime's ``TrainingAgent``.

    ``weights_to_train`` (default: every float initializer) become inputs of the training graph; the object keeps
    their current values in ``weights`` (name -> OrtValue). ``forward(inputs, training=True)`` keeps the execution
    state that ``backward(grad_outputs)`` consumes; ``backward`` returns the gradients of ``input_names_to_train``
    then of the weights, in the order of ``grad_names_``.

    ``gradients``: ``'onnxruntime'`` (training build only) builds the graphs with onnxruntime's
    ``OrtModuleGraphBuilder`` and runs them with its ``TrainingAgent`` (on CPU, Relu nodes are trained as
    ``x * (x > 0)``, :func:`ortflow.graph.editing.relu_as_mask`); ``'ortflow'`` uses ortflow's own gradient graph
    (:mod:`ortflow.engines.own_graphs`); ``'auto'`` (:data:`ortflow.trainers.parameters.GRADIENTS`) is ortflow's, and
    onnxruntime's on the training build for a graph holding an op outside ortflow's gradient rules.
    ``gradients_`` says which ran.
    """

    def __init__(
        self,
        model_onnx,
        weights_to_train: Sequence[str] | None = None,
        input_names_to_train: Sequence[str] | None = None,
        device: str = "cpu",
        session_options: SessionOptions | None = None,
        gradients: str = "auto",
    ):
        check_choice("gradients", gradients, ("auto", "ortflow", "onnxruntime"))
        if gradients == "onnxruntime":
            require_training("gradients='onnxruntime'")
        self._gradients = gradients
        self.gradients_ = "onnxruntime" if gradients == "onnxruntime" else "ortflow"
        model = g.load_model(model_onnx)
        g.check_loadable(model)
        self.placement = Placement.of(device)
        self.device = device = self.placement.device
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
        if self.placement.kind == "cpu" and self.gradients_ == "onnxruntime":
            model = g.relu_as_mask(model)
        return _named_nodes(g.initializers_as_inputs(model, self.weights_to_train_))

    def _build(self, session_options: SessionOptions | None) -> None:
        self._session_options = session_options or make_session_options()
        self._sessions: list[InferenceSession] = []  # the agents hold the C sessions only
        self._static: dict[tuple, tuple] = {}
        if self.gradients_ == "ortflow":
            try:
                own = build_own_graphs(_named_nodes(g.keep_outputs(self.model_, self.output_names_)),
                                       self.weights_to_train_,
                                       self.input_names_to_train_, self.placement, self._session_options)
            except NotDifferentiableError as exc:
                if self._gradients != "auto" or not TRAINING:
                    raise (exc if TRAINING else with_training_build_hint(exc)) from exc
                own = None
        if self.gradients_ == "ortflow" and own is not None:
            self.agent_, self.cache_, self.gradient_model_ = own.agent, None, own.training
            self.forward_model_, self._backward_model, self.graph_info_ = own.forward, own.backward, None
            self.feed_names_, self.grad_names_ = own.feed_names, own.grad_names
            self.non_differentiable_ = own.non_differentiable
            self.new_state = ForwardState
            return
        if self.gradients_ == "ortflow":  # 'auto' on the training build: an op outside ortflow's rules
            self.gradients_ = "onnxruntime"
            self.training_input_model_ = self._weights_as_inputs(self.model_)
        self.new_state = PartialGraphExecutionState
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
        if self.placement.kind == "cpu" and input_shapes is not None:  # the bias gradients' row sums, see g.row_sums_as_matmul
            model = g.row_sums_as_matmul(model)
        sess = make_session(model, self.placement, options)
        self._sessions.append(sess)
        info = builder.get_graph_info()
        dev = ort_device(self.device)
        n_fw = len(info.user_output_names) + len(info.frontier_node_arg_map)
        grads = [o.name for o in model.graph.output]
        agent = TrainingAgent(c_session(sess), [i.name for i in model.graph.input], [dev] * n_fw, grads,
                              [dev] * len(grads), 0)
        return agent, OrtValueCache(), model, builder

    def static_agent(self, input_shapes: Sequence[Sequence[int]], session_options: SessionOptions | None = None
                     ) -> tuple:
        """(TrainingAgent, OrtValueCache) of a training graph built for inputs of exactly ``input_shapes`` (one
        per model input). Knowing the shapes, onnxruntime resolves the broadcast bookkeeping of the backward
        pass (Shape, BroadcastGradientArgs, Reshape nodes) when it builds the graph instead of at every batch:
        a third less time per batch on an MLP at batch 15 (docs/CHANGELOG.md, round 1). Built once per shape; feeds
        and fetches are ordered as for :attr:`agent_`; ``session_options`` (default: those of :attr:`agent_`) apply
        to the first call for a shape. Falls back to :attr:`agent_` (reason in ``static_failures_``) when
        onnxruntime cannot build the graph for these shapes."""
        key = tuple(tuple(int(d) for d in shape) for shape in input_shapes)
        if len(key) != len(self.input_names_):
            raise ValueError(f"static_agent expects {len(self.input_names_)} shapes {self.input_names_}, got {key}")
        if self.gradients_ == "ortflow":  # one graph for any batch size; the cache keeps this shape's bindings
            return self._static.setdefault(key, (self.agent_, {}, None))[:2]
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
        state = self.new_state()
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
        if self.gradients_ == "ortflow":
            return self._backward_model
        return _backward_part(self.gradient_model_)

    def optimized_model(self) -> onnx.ModelProto:
        """The training graph after onnxruntime's graph optimizations (what the session runs)."""
        with tempfile.TemporaryDirectory(prefix="ortflow-opt-") as folder:
            path = os.path.join(folder, "optimized.onnx")
            options = make_session_options()
            options.optimized_model_filepath = path
            make_session(self.gradient_model_, self.placement, options)
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
        return g.save_graphs(self.graphs(), folder)


def _named_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (edited in place) with every unnamed node called ``<op>_<index>``, so a missing gradient names it."""
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{i}"
    return model


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
    inits = {i.name: i for i in model.graph.initializer}
    needed = free_inputs(backward, inits)
    typed = {v.name: v for v in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output)}
    inputs = [typed.get(n) or helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in needed]
    used_inits = [inits[n] for n in {i for node in backward for i in node.input} if n in inits]
    graph = helper.make_graph(backward, "backward", inputs, list(model.graph.output), used_inits)
    new = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    new.producer_name = "ortflow"
    return new
