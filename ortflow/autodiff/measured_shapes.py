"""Shapes onnx's inference cannot settle, measured by one run of a graph whose inputs all have fixed shapes.

An exported attention reshapes with shapes computed at run time (``Shape``, ``Gather``, ``Div``, ``Concat`` into
``Reshape``): onnx's shape inference (its data propagation, in some versions) leaves those axes unknown, so the
gradient rules would sum broadcast axes found at run time (``NonZero``: on CUDA a device sync and a host copy each,
a third of the transformer's step in issue 39). When every input's shape is fixed (``training_step(batch_rows=)``)
and no shape in the graph depends on the *values* it is fed, one run on zeros gives every tensor's shape for
every batch of that shape; :func:`with_measured_shapes` writes them into the graph's ``value_info``. The run is on
the CPU and keeps the tensors it measures: one forward pass's memory at that batch size, once per batch size (full
training caches its step graphs per process).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

#: ops whose output shape depends on their input values, not only on input shapes: a graph holding one is not
#: measured (a run on zeros would give the shape of zeros)
VALUE_SHAPED = {"NonZero", "Unique", "Compress", "NonMaxSuppression", "Loop", "If", "Scan", "StringSplit",
                "ImageDecoder", "MelWeightMatrix", "SequenceAt", "SequenceConstruct", "SequenceInsert",
                "SequenceErase", "SplitToSequence", "ConcatFromSequence", "Optional", "OptionalGetElement"}
#: ops whose output shape follows some inputs' values, by input position: measured only when those inputs are
#: computed from constants, initializers and shapes alone
SHAPE_INPUTS = {"Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "ConstantOfShape": (0,),
                "Pad": (1, 3), "Resize": (1, 2, 3), "Upsample": (1,), "OneHot": (1,), "Squeeze": (1,),
                "Unsqueeze": (1,), "Split": (1,), "TopK": (1,), "Range": (0, 1, 2), "CenterCropPad": (1,),
                "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
                "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,),
                "ReduceSumSquare": (1,), "MaxUnpool": (2,), "Col2Im": (1, 2), "AffineGrid": (1,), "DFT": (1, 2),
                "STFT": (1, 3)}


def _fixed_inputs(model: onnx.ModelProto) -> dict[str, tuple[tuple[int, ...], np.dtype]] | None:
    inits = {i.name for i in model.graph.initializer}
    found = {}
    for value in model.graph.input:
        if value.name in inits:
            continue
        tensor = value.type.tensor_type
        dims = tensor.shape.dim if tensor.HasField("shape") else None
        if dims is None or not all(d.HasField("dim_value") for d in dims) or not tensor.elem_type:
            return None
        found[value.name] = (tuple(d.dim_value for d in dims), helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    return found


def _shapes_follow_shapes_only(graph: onnx.GraphProto) -> bool:
    """True when no tensor's shape depends on values the graph is fed: no :data:`VALUE_SHAPED` op, no op of
    another domain, and every :data:`SHAPE_INPUTS` input computed from constants, initializers and shapes."""
    static = {i.name for i in graph.initializer}
    for node in graph.node:
        if node.op_type in VALUE_SHAPED or node.domain not in ("", "ai.onnx"):
            return False
        for position in SHAPE_INPUTS.get(node.op_type, ()):
            if position < len(node.input) and node.input[position] and node.input[position] not in static:
                return False
        if node.op_type in ("Constant", "Shape", "Size") or all(not i or i in static for i in node.input):
            static.update(node.output)
    return True


def with_measured_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the shape of every tensor onnx's inference leaves open written into ``value_info``, measured by
    one run on zeros, when every input has a fixed shape and no shape depends on values (else ``model`` as it
    is)."""
    from .._ort import InferenceSession
    from ..graph.builder import _inferred

    feeds = _fixed_inputs(model)
    if feeds is None or not _shapes_follow_shapes_only(model.graph):
        return model
    inferred = _inferred(model)
    known = {v.name: v for v in (*inferred.value_info, *inferred.output)}
    open_ = [name for node in model.graph.node for name in node.output if name and name in known
             and known[name].type.tensor_type.elem_type
             and not all(d.HasField("dim_value") for d in known[name].type.tensor_type.shape.dim)]
    if not open_:
        return model
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    outputs = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_tensor_value_info(n, known[n].type.tensor_type.elem_type, None)
                              for n in open_ if n not in outputs)
    try:
        session = InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        values = session.run(names, {n: np.zeros(shape, dtype) for n, (shape, dtype) in feeds.items()})
    except Exception:  # noqa: BLE001 - a graph that does not run on zeros: its shapes stay as inferred
        return model
    measured = dict(zip(names, values))
    new = onnx.ModelProto()
    new.CopyFrom(model)
    declared = {v.name for v in new.graph.value_info}
    for name in open_:
        if name in outputs or name in declared:
            continue
        new.graph.value_info.append(helper.make_tensor_value_info(name, known[name].type.tensor_type.elem_type,
                                                                  list(np.shape(measured[name]))))
    return new
