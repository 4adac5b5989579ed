"""The package's graphs: the flat step (the state as one vector), the unrolled steps, the prediction graph whose
weights another runtime patches in place, the manifest's description of a graph's inputs and outputs, and the check
of a graph read from a package against that description (:func:`check_graph`).

Every graph a package holds runs on a GPU through WebGPU too (onnxruntime-web's WebGPU execution provider): no node
binds more than :data:`MAX_BUFFERS` tensors (:func:`within_buffers`), and the gradient's batch-size counts are
computed on the device or are constants (:func:`device_counts`)."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..graph import editing as g
from .._ort import MAX_IR_VERSION
from ..autodiff.training import UPDATED
from ..exceptions import TrainingPackageError
from ..optimizers.learning_rates import LEARNING_RATE, STEP
from .format import FLAT_STATE, FLAT_UPDATED, UNROLLED_LOSSES, TensorSpec

#: the key of a graph's ``metadata_props`` holding the preprocessing its nodes do (the manifest's ``preprocess``)
PREPROCESS_KEY = "ortflow.preprocess"

#: the IR version of the package's graphs: onnxruntime 1.19 (the training build) to 1.32 read it
IR_VERSION = MAX_IR_VERSION

#: the most steps one unrolled graph holds, and the compute one run of the largest covers at most (estimated): a
#: run of onnxruntime-node costs 70-120 µs beside its compute, and copies the state in and out (D-wide: 370 kB)
MAX_UNROLLED, UNROLLED_TARGET_US = 32, 6000.0
#: the most nodes one default unrolled graph holds: its bytes and its session's creation grow with its nodes
#: (onnxruntime-web, issue 47: steps_32 of a small MLP's step 0.8-1.4 s, steps_8 0.3-0.5 s), the run overhead it saves
#: does not. Seed case A's step (58 nodes) keeps 32, an Adam MLP's (139) gets 16, a fine-tuned transformer's (383: its
#: frozen encoder runs at every step and costs itself several run overheads) 4 (timed in Python: 8 unrolled steps of it
#: ran no faster than 8 single ones; with 2 to 32 its package was 27 times its step and prediction graphs)
MAX_UNROLLED_NODES = 3000
#: the estimate of a step's time: per node, and floating-point operations per microsecond (one core, AVX), set from
#: steps timed in Python (2026-11-27, Xeon): seed case A's step 30 µs, D-wide's 1.2 ms
_NODE_US, _FLOPS_PER_US = 0.4, 100_000.0
#: the most tensors (inputs and outputs together) one node of a package's graph binds: WebGPU's default
#: ``maxStorageBuffersPerShaderStage``, which onnxruntime-web asks for (a node over it fails there: the native
#: WebGPU build throws "Too many storage buffers in shader", its JSEP build returns zeros)
MAX_BUFFERS = 8
#: ops whose many inputs are combined in order: rewritten as a chain of nodes of at most MAX_BUFFERS - 1 inputs, each
#: one taking the previous one's result first (the same sums in the same order as onnxruntime's CPU kernel)
_CHAINED = ("Sum", "Max", "Min")


def _dtype(elem_type: int) -> str:
    return "string" if elem_type == TensorProto.STRING else helper.tensor_dtype_to_np_dtype(elem_type).name


def _shape(value: onnx.ValueInfoProto) -> list:
    t = value.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]


def describe(value: onnx.ValueInfoProto, **extra) -> dict:
    return {"name": value.name, "shape": _shape(value), "dtype": _dtype(value.type.tensor_type.elem_type), **extra}


def with_ir(model: onnx.ModelProto) -> onnx.ModelProto:
    model.ir_version = min(model.ir_version or IR_VERSION, IR_VERSION)
    return model


def unrolled_bound(flat: onnx.ModelProto, batch: int, weights: Sequence[str], state: Mapping[str, np.ndarray]
                   ) -> int:
    """The largest number of steps an unrolled graph of ``flat`` holds by default: the power of two (at most
    :data:`MAX_UNROLLED`) whose steps take at most :data:`UNROLLED_TARGET_US` by the estimate ``_NODE_US`` per node
    plus ``6 * batch * weights`` operations (forward and backward) at ``_FLOPS_PER_US``: a step of a small model
    (seed case A: MLP (50, 10) on 100 features, batch 15, 29 µs) gets 32, one of milliseconds (D-wide: batch 256,
    92,000 weights, 1.4 ms) 4, a step of more than :data:`UNROLLED_TARGET_US` / 2 none (1). The largest graph also
    holds at most :data:`MAX_UNROLLED_NODES` nodes: a fine-tuned transformer's 383-node step gets 4, not 32."""
    flops = 6.0 * batch * sum(int(np.size(state[w])) for w in weights)
    nodes = len(flat.graph.node)
    step_us = _NODE_US * nodes + flops / _FLOPS_PER_US
    bound = 1
    while (bound * 2 <= MAX_UNROLLED and bound * 2 * step_us <= UNROLLED_TARGET_US
           and bound * 2 * nodes <= MAX_UNROLLED_NODES):
        bound *= 2
    return bound


def unrollable(step: onnx.ModelProto) -> bool:
    """Whether the nodes of ``step`` can be copied by renaming their names (no subgraph reads an outer name)."""
    return not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                   for node in step.graph.node for a in node.attribute)


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)


def within_buffers(model: onnx.ModelProto, limit: int = MAX_BUFFERS) -> onnx.ModelProto:
    """``model`` whose nodes bind at most ``limit`` tensors each (inputs and outputs): a ``Split`` into more pieces
    becomes a tree of ``Split`` nodes, a ``Concat`` of more inputs a tree of ``Concat`` nodes (the same values), a
    ``Sum``, ``Max`` or ``Min`` a chain (:data:`_CHAINED`). Other nodes are kept as they are (:func:`wide_nodes`
    names them)."""
    graph = model.graph
    if not wide_nodes(model, limit):
        return model
    taken = g.all_names(model)
    opset = _opset(model)
    inits = {i.name: i for i in graph.initializer}
    nodes, added, freed = [], [], set()

    def split_tree(source: str, outputs: list[str], sizes: list[int], axis: int) -> None:
        """``Split`` nodes of at most ``limit - 2`` pieces (with the sizes' input), in a tree as shallow as can be
        (``Slice`` nodes would do, but onnxruntime's CPU optimizer fuses them back into one ``Split``)."""
        most = limit - 2
        span = 1
        while span * most < len(sizes):
            span *= most
        groups = [range(at, min(at + span, len(sizes))) for at in range(0, len(sizes), span)]
        names = [outputs[r[0]] if len(r) == 1 else g._fresh(f"{source}/part", taken) for r in groups]
        parts = [sum(sizes[i] for i in r) for r in groups]
        if opset >= 13:
            cut = g._fresh(f"{source}/sizes", taken)
            added.append(helper.make_tensor(cut, TensorProto.INT64, [len(parts)], parts))
            nodes.append(helper.make_node("Split", [source, cut], names, axis=axis))
        else:
            nodes.append(helper.make_node("Split", [source], names, axis=axis, split=parts))
        for r, name in zip(groups, names):
            if len(r) > 1:
                split_tree(name, [outputs[i] for i in r], [sizes[i] for i in r], axis)

    for node in graph.node:
        inputs = [i for i in node.input if i]
        if len(inputs) + len([o for o in node.output if o]) <= limit:
            nodes.append(node)
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if node.op_type == "Split":
            sizes = next((list(a.ints) for a in node.attribute if a.name == "split"), None)
            if len(node.input) > 1 and node.input[1]:
                sizes = onnx.numpy_helper.to_array(inits[node.input[1]]).tolist() if node.input[1] in inits else None
            if sizes is None:  # equal pieces of an axis known only at run time: kept
                nodes.append(node)
                continue
            split_tree(node.input[0], list(node.output), [int(x) for x in sizes], axis)
            freed.update(node.input[1:])
        elif node.op_type == "Concat":
            while len(inputs) > limit - 1:  # a level of the tree: groups of limit - 1, in order
                level = []
                for at in range(0, len(inputs), limit - 1):
                    group = inputs[at: at + limit - 1]
                    if len(group) == 1:
                        level.append(group[0])
                        continue
                    level.append(g._fresh(f"{node.output[0]}/part", taken))
                    nodes.append(helper.make_node("Concat", group, [level[-1]], axis=axis))
                inputs = level
            nodes.append(helper.make_node("Concat", inputs, list(node.output), name=node.name, axis=axis))
        elif node.op_type in _CHAINED and opset >= 8:
            done = inputs[: limit - 1]
            rest = inputs[limit - 1:]
            while rest:
                partial = g._fresh(f"{node.output[0]}/part", taken)
                nodes.append(helper.make_node(node.op_type, done, [partial]))
                done, rest = [partial, *rest[: limit - 2]], rest[limit - 2:]
            nodes.append(helper.make_node(node.op_type, done, list(node.output), name=node.name))
        else:
            nodes.append(node)
    read = {i for n in nodes for i in n.input} | {o.name for o in graph.output}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    kept = [i for i in out.graph.initializer if i.name in read or i.name not in freed]  # a Split's sizes, replaced
    del out.graph.initializer[:]
    out.graph.initializer.extend([*kept, *added])
    return out


def wide_nodes(model: onnx.ModelProto, limit: int = MAX_BUFFERS) -> list[str]:
    """The nodes of ``model`` that bind more than ``limit`` tensors: ``"<op> <first output> (<count>)"``."""
    return [f"{n.op_type} {n.output[0]!r} ({len([x for x in (*n.input, *n.output) if x])})" for n in model.graph.node
            if len([x for x in (*n.input, *n.output) if x]) > limit]


def _size_factor(shape) -> tuple[int, int] | None:
    """(how many axes are the ``batch`` axis, the product of the others) of ``shape``; None when one is unknown."""
    if shape is None or any(not isinstance(d, int) and d != "batch" for d in shape):
        return None
    return sum(d == "batch" for d in shape), int(np.prod([d for d in shape if d != "batch"], dtype=np.int64))


def device_counts(step: onnx.ModelProto, batch: int | None = None) -> onnx.ModelProto:
    """``step`` whose float counts of elements (``Cast(Size(a))`` and ``Cast(Div(Size(a), Size(b)))``: a mean's
    gradient, a weighted loss's row count) are computed with float ops a GPU runs, not with int64 ops that fall
    back to the CPU there: a constant when the shapes are known (``batch`` rows: the unrolled graphs' fixed
    batches), else ``ReduceSum`` of ones along the ``batch`` axis times a constant. The values are the same floats
    (exact integers below 2**24), so the steps are bit for bit the same. Counts of other shapes are kept; any
    other ``Size`` of a fixed shape becomes an int64 constant."""
    model = onnx.ModelProto()
    model.CopyFrom(step)
    graph = model.graph
    if batch is not None:
        for value in graph.input:
            for dim in value.type.tensor_type.shape.dim:
                if dim.dim_param == "batch":
                    dim.Clear()
                    dim.dim_value = batch
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 (an op onnx does not know: nothing is rewritten)
        return step
    shapes = {v.name: _shape(v) for v in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output)}
    producer = {o: n for n in graph.node for o in n.output}
    uses = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    for value in graph.output:
        uses[value.name] = uses.get(value.name, 0) + 1
    taken = g.all_names(model)
    opset = _opset(model)
    replaced, dropped, added = {}, set(), []

    def sizes_of(name: str):
        node = producer.get(name)
        if node is None or uses.get(name) != 1:
            return None
        if node.op_type == "Size":
            return [node], [node.input[0]], []
        if node.op_type == "Div" and all(producer.get(i) is not None and producer[i].op_type == "Size"
                                         and uses.get(i) == 1 for i in node.input):
            return [node, producer[node.input[0]], producer[node.input[1]]], \
                [producer[node.input[0]].input[0]], [producer[node.input[1]].input[0]]
        return None

    for cast in graph.node:
        if cast.op_type != "Cast" or next((a.i for a in cast.attribute if a.name == "to"), 0) != TensorProto.FLOAT:
            continue
        found = sizes_of(cast.input[0])
        if found is None:
            continue
        chain, over, under = found
        factors = [_size_factor(shapes.get(name)) for name in (*over, *under)]
        if None in factors:
            continue
        power = sum(f[0] for f in factors[: len(over)]) - sum(f[0] for f in factors[len(over):])
        number = int(np.prod([f[1] for f in factors[: len(over)]], dtype=np.int64))
        divisor = int(np.prod([f[1] for f in factors[len(over):]], dtype=np.int64))
        if power not in (0, 1) or not divisor or number % divisor or not 0 < number // divisor < 2 ** 24 or \
                (power and opset < 15):  # Shape's start and end: opset 15
            continue
        number //= divisor
        out = cast.output[0]
        dropped.update(id(n) for n in (cast, *chain))
        if power == 0:
            added.append(helper.make_tensor(out, TensorProto.FLOAT, [], [float(number)]))
            continue
        name = over[0]
        axis = shapes[name].index("batch")
        rows, one, ones = (g._fresh(f"{out}/{what}", taken) for what in ("rows", "one", "ones"))
        added.append(helper.make_tensor(one, TensorProto.FLOAT, [], [1.0]))
        count = out if number == 1 else g._fresh(f"{out}/batch", taken)
        new = [helper.make_node("Shape", [name], [rows], start=axis, end=axis + 1),
               helper.make_node("Expand", [one, rows], [ones]),
               helper.make_node("ReduceSum", [ones], [count], keepdims=0)]
        if number != 1:
            factor = g._fresh(f"{out}/factor", taken)
            added.append(helper.make_tensor(factor, TensorProto.FLOAT, [], [float(number)]))
            new.append(helper.make_node("Mul", [count, factor], [out]))
        replaced[id(cast)] = new
    for size in graph.node:  # any other Size of a fixed shape (a max pool's gradient): an int64 constant
        shape = shapes.get(size.input[0]) if size.op_type == "Size" and id(size) not in dropped else None
        if shape is not None and all(isinstance(d, int) for d in shape):
            dropped.add(id(size))
            added.append(helper.make_tensor(size.output[0], TensorProto.INT64, [],
                                            [int(np.prod(shape, dtype=np.int64))]))
    if not dropped:
        return step
    nodes = []
    for node in graph.node:
        nodes.extend(replaced.get(id(node), []) if id(node) in dropped else [node])
    out = onnx.ModelProto()
    out.CopyFrom(step)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(added)
    return out


def unrolled_step(step: onnx.ModelProto, count: int, batch: int, table: list[dict]) -> onnx.ModelProto:
    """``count`` copies of the step ``step`` in one graph, each on its ``batch`` rows of the batched inputs (a
    ``Split`` of ``count * batch`` rows; each copy's counts of rows are constants, :func:`device_counts`), copy
    ``i`` reading the ``<name>_updated`` tensors of copy ``i - 1`` as its state and the input ``step`` plus ``i`` as
    its step number; outputs the ``count`` losses
    (:data:`UNROLLED_LOSSES`) and the last copy's state, then made flat (:func:`flat_step`: the state one vector in
    and out, split once and concatenated once). The copies' names are prefixed ``u<i>/``; initializers and
    ``learning_rate`` are shared."""
    step = device_counts(step, batch)  # every copy's batch is full: its counts are constants
    graph = step.graph
    if UNROLLED_LOSSES in g.all_names(step):
        raise TrainingPackageError(f"the step graph already uses the name {UNROLLED_LOSSES!r}")
    opset = next((o.version for o in step.opset_import if o.domain in ("", "ai.onnx")), 13)
    state = {t["name"] for t in table}
    updated = {n + UPDATED for n in state}
    shared = {i.name for i in graph.initializer} | {LEARNING_RATE, ""}
    batched = {v.name for v in graph.input} - state - {LEARNING_RATE, STEP}
    nodes, inits = [], []
    sizes = helper.make_tensor("unrolled/sizes", TensorProto.INT64, [count], [batch] * count)
    for v in graph.input:
        if v.name in batched:
            pieces = [f"{v.name}/{i}" for i in range(count)]
            nodes.append(helper.make_node("Split", [v.name, sizes.name], pieces, axis=0) if opset >= 13 else
                         helper.make_node("Split", [v.name], pieces, axis=0, split=[batch] * count))
    if opset >= 13:
        inits.append(sizes)
    reads_step = any(v.name == STEP for v in graph.input)
    one = helper.make_tensor("unrolled/one", TensorProto.INT64, [1], [1])
    inits.append(one)
    for i in range(count):
        def name(x: str, i=i) -> str:
            if x in shared or (i == 0 and (x in state or x == STEP)) or (i == count - 1 and x in updated):
                return x
            if x in state:
                return f"u{i - 1}/{x}{UPDATED}"
            if x == STEP:
                return f"unrolled/{STEP}/{i}"
            if x in batched:
                return f"{x}/{i}"
            return f"u{i}/{x}"

        if reads_step and i > 0:
            offset = helper.make_tensor(f"unrolled/{STEP}/+{i}", TensorProto.FLOAT, [], [float(i)])
            inits.append(offset)
            nodes.append(helper.make_node("Add", [STEP, offset.name], [name(STEP)]))
        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"u{i}/{node.name}" if node.name else ""
            copy.input[:] = [name(x) for x in node.input]
            copy.output[:] = [name(x) for x in node.output]
            nodes.append(copy)
        nodes.append(helper.make_node("Reshape", [name(graph.output[0].name), one.name], [f"{UNROLLED_LOSSES}/{i}"]))
    nodes.append(helper.make_node("Concat", [f"{UNROLLED_LOSSES}/{i}" for i in range(count)], [UNROLLED_LOSSES],
                                  axis=0))
    inputs = []
    for v in graph.input:
        v = onnx.ValueInfoProto.FromString(v.SerializeToString())
        if v.name in batched and len(v.type.tensor_type.shape.dim):
            v.type.tensor_type.shape.dim[0].Clear()
            v.type.tensor_type.shape.dim[0].dim_value = count * batch
        inputs.append(v)
    outputs = [helper.make_tensor_value_info(UNROLLED_LOSSES, TensorProto.FLOAT, [count]), *graph.output[1:]]
    unrolled = helper.make_graph(nodes, f"{graph.name}_x{count}", inputs, outputs, [*graph.initializer, *inits])
    return flat_step(helper.make_model(unrolled, opset_imports=list(step.opset_import), ir_version=step.ir_version,
                                        producer_name=step.producer_name), table)


def flat_step(step: onnx.ModelProto, table: list[dict]) -> onnx.ModelProto:
    """``step`` taking the whole state as one float32 vector :data:`FLAT_STATE` (the tensors of ``table`` one after
    the other) and giving it back as :data:`FLAT_UPDATED`, the loss first: the same nodes between a ``Split`` and
    ``Reshape`` of the vector and a ``Concat`` of the updated tensors. A runtime that copies every input and output
    at each run (onnxruntime-node, onnxruntime-web) crosses 2 state tensors per step instead of twice their number,
    and feeds each step's output vector to the next step as it is. The split and the concatenation, and any other
    node over :data:`MAX_BUFFERS` tensors, are rewritten by :func:`within_buffers`."""
    names = [t["name"] for t in table]
    taken = g.all_names(step)
    clash = sorted({FLAT_STATE, FLAT_UPDATED} & taken)
    if clash:
        raise TrainingPackageError(f"the step graph already uses the names {clash}")
    opset = next((o.version for o in step.opset_import if o.domain in ("", "ai.onnx")), 13)
    sizes = [int(np.prod(t["shape"], dtype=np.int64)) for t in table]
    total = int(sum(sizes))
    nodes, inits = [], []
    pieces = [f"{FLAT_STATE}/{n}" for n in names]
    split_sizes = helper.make_tensor(f"{FLAT_STATE}/sizes", TensorProto.INT64, [len(sizes)], sizes)
    if opset >= 13:
        inits.append(split_sizes)
        nodes.append(helper.make_node("Split", [FLAT_STATE, split_sizes.name], pieces, axis=0))
    else:
        nodes.append(helper.make_node("Split", [FLAT_STATE], pieces, axis=0, split=sizes))
    for t, piece in zip(table, pieces):
        shape = helper.make_tensor(f"{piece}/shape", TensorProto.INT64, [len(t["shape"])], list(t["shape"]))
        inits.append(shape)
        nodes.append(helper.make_node("Reshape", [piece, shape.name], [t["name"]]))
    flat_shape = helper.make_tensor(f"{FLAT_UPDATED}/flat", TensorProto.INT64, [1], [-1])
    inits.append(flat_shape)
    tail = []
    for name in names:
        tail.append(helper.make_node("Reshape", [name + UPDATED, flat_shape.name], [f"{FLAT_UPDATED}/{name}"]))
    tail.append(helper.make_node("Concat", [f"{FLAT_UPDATED}/{n}" for n in names], [FLAT_UPDATED], axis=0))
    graph = step.graph
    state = set(names)
    vector = helper.make_tensor_value_info(FLAT_STATE, TensorProto.FLOAT, [total])
    inputs = [v for v in graph.input if v.name not in state]
    first_scalar = next((i for i, v in enumerate(inputs) if v.name in (LEARNING_RATE, STEP)), len(inputs))
    inputs.insert(first_scalar, vector)
    outputs = [graph.output[0], helper.make_tensor_value_info(FLAT_UPDATED, TensorProto.FLOAT, [total])]
    flat = helper.make_graph([*nodes, *graph.node, *tail], f"{graph.name}_flat", inputs, outputs,
                             [*graph.initializer, *inits], value_info=list(graph.value_info))
    model = helper.make_model(flat, opset_imports=list(step.opset_import), ir_version=step.ir_version,
                              producer_name=step.producer_name)
    return within_buffers(model)


def standardize_input(model: onnx.ModelProto, name: str, mean, scale, prefix: str) -> onnx.ModelProto:
    """A copy of ``model`` whose nodes read ``(name - mean) / scale`` where they read the input ``name`` (``Sub``
    and ``Div`` in front, the float32 constants ``<prefix>mean`` and ``<prefix>scale``: not weights)."""
    inner = f"{prefix}standardized"
    return _affine(model, name, inner, [("Sub", mean, "mean", f"{prefix}centered"), ("Div", scale, "scale", inner)],
                   prefix, front=True)


def unscale_output(model: onnx.ModelProto, name: str, mean, scale, prefix: str) -> onnx.ModelProto:
    """A copy of ``model`` whose output ``name`` is ``value * scale + mean`` of what it was (``Mul`` and ``Add``
    behind; the nodes that read it still read the value before)."""
    inner = f"{prefix}standardized"
    return _affine(model, name, inner, [("Mul", scale, "scale", f"{prefix}scaled"), ("Add", mean, "mean", name)],
                   prefix, front=False)


def _affine(model: onnx.ModelProto, name: str, inner: str, ops: list, prefix: str, front: bool) -> onnx.ModelProto:
    new = onnx.ModelProto()
    new.CopyFrom(model)
    taken = g.all_names(new)
    clash = sorted({inner, *(f"{prefix}{key}" for _, _, key, _ in ops), *(out for *_, out in ops[:-1])} & taken)
    if clash:
        raise TrainingPackageError(f"the graph already uses the names {clash}")
    graph = new.graph
    for node in graph.node:
        node.input[:] = [inner if x == name else x for x in node.input]
        if not front:
            node.output[:] = [inner if x == name else x for x in node.output]
    added, source = [], name if front else inner
    for op, values, key, out in ops:
        constant = f"{prefix}{key}"
        graph.initializer.append(numpy_helper.from_array(
            np.asarray(values, dtype=np.float32).reshape(-1), constant))
        added.append(helper.make_node(op, [source, constant], [out], name=f"{prefix}{op.lower()}"))
        source = out
    nodes = [*added, *graph.node] if front else [*graph.node, *added]
    del graph.node[:]
    graph.node.extend(nodes)
    return new


def patchable(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> tuple[bytes, list[dict]]:
    """``model`` serialized with the float32 initializers ``values`` in ``raw_data``, and where each one's bytes
    lie in it: ``[{name, shape, offset, bytes}]``. The offsets are found by writing a distinct random pattern in
    each initializer (same length: the serialized layout does not change), locating it once, then writing the
    values there."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    inits = {i.name: i for i in model.graph.initializer}
    values = {n: np.ascontiguousarray(v, dtype="<f4") for n, v in values.items() if n in inits}
    for name in values:
        if inits[name].data_type != TensorProto.FLOAT:
            raise TrainingPackageError(f"weight {name!r} of the prediction graph is not float32")
    rng = np.random.default_rng(0)
    for _ in range(16):
        patterns = {}
        for name, array in values.items():
            init = inits[name]
            init.ClearField("float_data")
            init.ClearField("external_data")
            init.data_location = TensorProto.DEFAULT
            patterns[name] = rng.integers(0, 256, size=array.nbytes, dtype=np.uint8).tobytes()
            init.raw_data = patterns[name]
        data = bytearray(model.SerializeToString())
        offsets = {}
        for name, pattern in patterns.items():
            at = data.find(pattern) if pattern else 0
            if at < 0 or (pattern and data.find(pattern, at + 1) >= 0):
                break
            offsets[name] = at
        else:
            for name, at in offsets.items():
                data[at: at + values[name].nbytes] = values[name].tobytes()
            return bytes(data), [{"name": n, "shape": list(values[n].shape), "offset": offsets[n],
                                  "bytes": values[n].nbytes} for n in values]
    raise TrainingPackageError("could not locate the weights' bytes in the prediction graph")  # pragma: no cover


def check_graph(specs_in: Sequence[TensorSpec], specs_out: Sequence[TensorSpec], data: bytes, where: str) -> None:
    """The graph ``data`` takes the inputs ``specs_in`` and gives the outputs ``specs_out`` of its manifest entry
    ``where`` (same names in the same order, dtypes, ranks and fixed sizes): :class:`TrainingPackageError` naming
    the manifest's field otherwise."""
    try:
        model = onnx.load_from_string(data)
    except Exception as exc:  # noqa: BLE001 (protobuf's DecodeError and friends)
        raise TrainingPackageError(f"{where}.file is not a readable ONNX graph: {exc}") from exc
    inits = {i.name for i in model.graph.initializer}
    for key, specs, values in (("inputs", specs_in, [v for v in model.graph.input if v.name not in inits]),
                               ("outputs", specs_out, list(model.graph.output))):
        names = [v.name for v in values]
        if names != [s.name for s in specs]:
            raise TrainingPackageError(f"{where}.{key}: the manifest lists {[s.name for s in specs]}, the graph has "
                                       f"{names}")
        for i, (spec, value) in enumerate(zip(specs, values)):
            actual = describe(value)
            if spec.dtype != actual["dtype"]:
                raise TrainingPackageError(f"{where}.{key}[{i}].dtype: {spec.dtype!r}, the graph has "
                                           f"{actual['dtype']!r}")
            shape = actual["shape"]
            if spec.shape is None or shape is None:
                continue
            if len(spec.shape) != len(shape) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                                    or isinstance(a, int) != isinstance(b, int)
                                                    for a, b in zip(spec.shape, shape)):
                raise TrainingPackageError(f"{where}.{key}[{i}].shape: {spec.shape}, the graph has {shape}")
