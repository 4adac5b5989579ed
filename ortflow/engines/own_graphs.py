"""Forward and backward passes from ortflow's own gradient graph (the builder of :func:`ortflow.onnx_derivative`),
for any onnxruntime (the plain build has no ``TrainingAgent``).

The derivative graph of the model's float outputs, with their upstream gradients ``<output>_grad`` as inputs, is
split in two: the nodes that do not depend on those gradients form the forward graph (the model's outputs plus the
values the backward pass reuses, *saved*), the others the backward graph. Outputs of other types (an ``ArgMax``)
have no gradient: they are the non-differentiable outputs, as in onnxruntime-training. :class:`GraphAgent` runs
the two graphs with ``TrainingAgent``'s interface (``run_forward`` keeps the saved values in the state that
``run_backward`` consumes), so the trainer's batch loop is the same on both builds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx
import onnx.shape_inference
from onnx import helper

from ..autodiff.builder import refuse_unreached, unreached
from ..autodiff.derivative import gradient_graph
from ..exceptions import UnsupportedModelError
from ..graph.editing import FLOAT_TYPES
from .._ort import _C, InferenceSession, SessionOptions
from ..runtime.sessions import c_session, ort_device
from ..runtime.placement import Placement


class ForwardState:
    """What a forward pass leaves for the backward pass: its feeds and outputs (C OrtValues)."""

    __slots__ = ("feeds", "outputs", "cache")

    def __init__(self):
        self.feeds = None
        self.outputs = None
        self.cache = None


@dataclass
class OwnGraphs:
    """The derivative graph (``training``), its two parts and the agent running them."""

    training: onnx.ModelProto
    forward: onnx.ModelProto
    backward: onnx.ModelProto
    agent: GraphAgent
    feed_names: list[str]
    grad_names: list[str]
    non_differentiable: list[int]  # positions of the outputs that take no upstream gradient


def build_own_graphs(model: onnx.ModelProto, weights: Sequence[str], inputs: Sequence[str],
                     placement: Placement | str, options: SessionOptions) -> OwnGraphs:
    """Forward and backward graphs of ``model``'s float outputs with respect to ``inputs`` then ``weights``, their
    sessions at ``placement``."""
    placement = Placement.of(placement)
    device = placement.device
    outputs = [o.name for o in model.graph.output]
    floats = [o.name for o in model.graph.output if o.type.tensor_type.elem_type in FLOAT_TYPES]
    if not floats:
        raise UnsupportedModelError(f"the graph's outputs {outputs} are not float tensors: nothing to differentiate")
    unreached_by_all = set(weights).intersection(*(unreached(model, list(weights), o) for o in floats))
    refuse_unreached(model, [w for w in weights if w in unreached_by_all], floats[0])
    seeds = [f"{o}_grad" for o in floats]
    derivative = gradient_graph(model, list(inputs) + list(weights), floats, seeds, outputs, list(weights))
    n_out = len(outputs)
    grad_names = [o.name for o in derivative.graph.output[n_out:]]
    feed_names = [i.name for i in derivative.graph.input if i.name not in seeds]
    tainted, forward, backward = set(seeds), [], []
    for node in derivative.graph.node:  # in graph order: a node after the ones it reads
        if tainted.intersection(node.input) or set(grad_names).intersection(node.output):
            backward.append(node)
            tainted.update(node.output)
        else:
            forward.append(node)
    inits = {i.name: i for i in derivative.graph.initializer}
    bw_inputs = free_inputs(backward, inits)
    saved = [n for n in bw_inputs if n not in seeds and n not in feed_names and n not in outputs]
    types = _value_types(derivative)
    untyped = [n for n in saved if n not in types]  # after an op onnx cannot infer (an ai.onnx.ml Scaler)
    fw_outputs = list(derivative.graph.output[:n_out]) + [types.get(n) or helper.ValueInfoProto(name=n)
                                                          for n in saved]
    fw_inputs = [i for i in derivative.graph.input if i.name not in seeds]
    forward_model = _model(derivative, forward, "forward", fw_inputs, fw_outputs, inits)
    providers = placement.providers()
    forward_session = InferenceSession(forward_model.SerializeToString(), options, providers=providers)
    if untyped:  # onnxruntime's own inference types them: declare those types for the backward graph's inputs
        resolved = {o.name: o.type for o in forward_session.get_outputs()}
        for name in untyped:
            types[name] = helper.make_tensor_value_info(name, _ORT_ELEMENT_TYPES[resolved[name]], None)
            forward_model.graph.output[n_out + saved.index(name)].CopyFrom(types[name])
    typed_inputs = {i.name: i for i in derivative.graph.input}
    bw_declared = [typed_inputs.get(n) or types[n] for n in bw_inputs]
    backward_model = _model(derivative, backward, "backward", bw_declared, list(derivative.graph.output[n_out:]),
                            inits)
    sources_of_inputs = []
    for name in bw_inputs:
        if name in seeds:
            sources_of_inputs.append(("seed", seeds.index(name)))
        elif name in feed_names:
            sources_of_inputs.append(("feed", feed_names.index(name)))
        else:
            sources_of_inputs.append(("output", outputs.index(name) if name in outputs else n_out + saved.index(name)))
    agent = GraphAgent(forward_session,
                       InferenceSession(backward_model.SerializeToString(), options, providers=providers),
                       sources_of_inputs, device, n_out)
    non_differentiable = [i for i, o in enumerate(outputs) if o not in floats]
    return OwnGraphs(derivative, forward_model, backward_model, agent, feed_names, grad_names, non_differentiable)


def free_inputs(nodes: Sequence[onnx.NodeProto], initializers) -> list[str]:
    """The names ``nodes`` read that none of them produces and that are not ``initializers``, in reading order."""
    produced = {name for node in nodes for name in node.output}
    free: list[str] = []
    for node in nodes:
        for name in node.input:
            if name and name not in produced and name not in initializers and name not in free:
                free.append(name)
    return free


#: onnxruntime's type strings of the tensors a gradient graph saves, as ONNX element types
_ORT_ELEMENT_TYPES = {"tensor(float)": onnx.TensorProto.FLOAT, "tensor(double)": onnx.TensorProto.DOUBLE,
                      "tensor(float16)": onnx.TensorProto.FLOAT16, "tensor(bfloat16)": onnx.TensorProto.BFLOAT16,
                      "tensor(int64)": onnx.TensorProto.INT64, "tensor(int32)": onnx.TensorProto.INT32,
                      "tensor(bool)": onnx.TensorProto.BOOL}


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    return {v.name: v for v in list(graph.value_info) + list(graph.output) + list(graph.input)}


def _model(source: onnx.ModelProto, nodes: list, name: str, inputs: list, outputs: list, inits: dict
           ) -> onnx.ModelProto:
    used = {n for node in nodes for n in node.input}
    graph = helper.make_graph(nodes, f"{source.graph.name}_{name}", inputs, outputs,
                              [init for key, init in inits.items() if key in used])
    new = helper.make_model(graph, opset_imports=list(source.opset_import), ir_version=source.ir_version)
    new.producer_name = "ortflow"
    return new


class GraphAgent:
    """``TrainingAgent``'s ``run_forward`` / ``run_backward`` over the forward and backward sessions.

    ``run_forward(feeds, fetches, state, cache)``: ``feeds`` in feed order (model inputs, then weights); when
    ``fetches`` already holds values, the model outputs are written into them, else they are appended.
    ``run_backward(feeds, fetches, state)``: ``feeds`` holds the differentiable outputs' gradients; gradients go
    into the values of ``fetches`` (same shapes) or are appended when it is empty.

    With a ``cache`` (a dict, one per batch shape: what :meth:`OrtGradientForwardBackward.static_agent` returns)
    the IO bindings are built once per feeds vector and reused, so a batch of the trainer binds nothing: the saved
    values stay in the buffers onnxruntime allocated at the first run (checked by address at every backward pass,
    rebound if onnxruntime moved them)."""

    def __init__(self, forward: InferenceSession, backward: InferenceSession, sources: list, device: str,
                 n_outputs: int = 1):
        self._fw, self._bw = c_session(forward), c_session(backward)
        self._n_outputs = n_outputs
        self._sessions = (forward, backward)
        self._fw_in = [i.name for i in forward.get_inputs()]
        self._fw_out = [o.name for o in forward.get_outputs()]
        self._bw_in = [i.name for i in backward.get_inputs()]
        self._bw_out = [o.name for o in backward.get_outputs()]
        self._sources = sources  # per backward input, in order: (kind, index)
        self._saved = [index for kind, index in sources if kind == "output"]  # (model outputs may be read too)
        self._device = ort_device(device)

    def _forward_binding(self, feeds, fetches):
        binding = _C.SessionIOBinding(self._fw)
        for i, name in enumerate(self._fw_in):
            binding.bind_ortvalue_input(name, feeds[i])
        preset = len(fetches) > 0
        for i, name in enumerate(self._fw_out):
            if preset and i < self._n_outputs:
                binding.bind_ortvalue_output(name, fetches[i])
            else:
                binding.bind_output(name, self._device)
        return binding, preset

    def run_forward(self, feeds, fetches, state: ForwardState, cache: dict | None = None) -> None:
        entry = None if cache is None else cache.get(("fw", id(feeds), id(fetches)))
        if entry is None:
            entry = (feeds, fetches, *self._forward_binding(feeds, fetches))  # keeps the vectors alive
            if cache is not None:
                _bounded(cache)["fw", id(feeds), id(fetches)] = entry
        _, _, binding, preset = entry
        self._fw.run_with_iobinding(binding, None)
        outputs = binding.get_outputs()
        if not preset:
            for i in range(self._n_outputs):
                fetches.push_back(outputs[i])
        state.feeds, state.outputs, state.cache = feeds, outputs, cache

    def _backward_inputs(self, feeds, state: ForwardState) -> list:
        return [(feeds if kind == "seed" else state.feeds if kind == "feed" else state.outputs)[index]
                for kind, index in self._sources]

    def run_backward(self, feeds, fetches, state: ForwardState) -> None:
        cache, key = state.cache, ("bw", id(state.feeds), id(feeds), id(fetches))
        entry = None if cache is None else cache.get(key)
        outputs = state.outputs
        addresses = [outputs[i].data_ptr() for i in self._saved]
        if entry is None or entry[3] != addresses:
            inputs = self._backward_inputs(feeds, state)
            binding = _C.SessionIOBinding(self._bw)
            for name, value in zip(self._bw_in, inputs):
                binding.bind_ortvalue_input(name, value)
            preset = len(fetches) == len(self._bw_out)
            for i, name in enumerate(self._bw_out):
                if preset:
                    binding.bind_ortvalue_output(name, fetches[i])
                else:
                    binding.bind_output(name, self._device)
            entry = (feeds, fetches, binding, addresses, preset, inputs)  # inputs: kept alive with the binding
            if cache is not None:
                _bounded(cache)[key] = entry
        binding, preset = entry[2], entry[4]
        self._bw.run_with_iobinding(binding, None)
        if not preset:
            for value in binding.get_outputs():
                fetches.push_back(value)
        state.feeds = state.outputs = state.cache = None


#: bindings a cache holds: the trainer needs four per batch shape (forward and backward, two weight parities); a
#: caller building new vectors at every call (ortflow.torch) must not make it grow
CACHE_ENTRIES = 8


def _bounded(cache: dict) -> dict:
    if len(cache) >= CACHE_ENTRIES:
        cache.clear()
    return cache
