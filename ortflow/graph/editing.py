"""Reading, checking and editing ONNX graphs: initializers, outputs, pruning, safe loading."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Union

import numpy as np
import onnx
import onnx.shape_inference
from onnx import TensorProto, numpy_helper

from .._ort import MAX_OPSET, max_ir_version, runtime_name
from ..exceptions import UnsafePathError, UnsupportedModelError

ModelLike = Union[onnx.ModelProto, bytes, str, os.PathLike]

FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)


def load_model(model: ModelLike) -> onnx.ModelProto:
    """Return a ModelProto from a ModelProto, serialized bytes or a file path.

    A file whose external data points outside its folder is refused (:class:`UnsafePathError`).
    """
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return _parsed(bytes(model), "the bytes given")
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"model_onnx: no ONNX file at {str(path)!r}")
        proto = _parsed(path.read_bytes(), str(path))
        _check_external_data(proto, path.parent)
        onnx.load_external_data_for_model(proto, str(path.parent))
        return proto
    raise TypeError(f"model_onnx must be an onnx.ModelProto, bytes or a path, not {type(model).__name__}")


def _parsed(data: bytes, what: str) -> onnx.ModelProto:
    """``data`` parsed as a ModelProto that has a graph; :class:`UnsupportedModelError` for anything else."""
    if not data:
        raise UnsupportedModelError(f"model_onnx: {what} is empty, not an ONNX model")
    try:
        proto = onnx.load_from_string(data)
    except Exception as exc:  # DecodeError, UnicodeDecodeError...: the protobuf parser's many ways to say it
        raise UnsupportedModelError(
            f"model_onnx: {what} is not a readable ONNX model, truncated or corrupted ({type(exc).__name__}: "
            f"{str(exc)[:200]})") from exc
    if not proto.HasField("graph"):
        raise UnsupportedModelError(f"model_onnx: {what} holds no graph (truncated or corrupted, or not ONNX)")
    return proto


def _check_external_data(proto: onnx.ModelProto, folder: Path) -> None:
    """External data must stay inside ``folder`` and hold the bytes each initializer declares."""
    root = folder.resolve()
    for tensor in proto.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        target = (root / location).resolve()
        if os.path.isabs(location) or not target.is_relative_to(root):
            raise UnsafePathError(
                f"initializer {tensor.name!r} stores its data at {location!r}, outside the model's folder {str(root)!r}"
            )
        needed = int(info.get("offset", 0) or 0) + _declared_bytes(tensor)
        available = target.stat().st_size if target.is_file() else -1
        if available < needed:
            raise UnsupportedModelError(
                f"initializer {tensor.name!r} declares {_declared_bytes(tensor)} bytes at {location!r} (offset "
                f"{info.get('offset', 0)}), but that file " + ("does not exist" if available < 0 else
                                                                 f"holds {available} bytes"))


#: the highest opset of each domain onnxruntime-training 1.19.2 loads (ai.onnx.ml 6 is refused, seen)
MAX_DOMAIN_OPSET = {"": MAX_OPSET, "ai.onnx": MAX_OPSET, "ai.onnx.ml": 5, "ai.onnx.training": 1,
                    "ai.onnx.preview.training": 1, "com.microsoft": 1}
#: the TensorProto field holding each type's values when raw_data is not used, and values per element
_TYPED_FIELDS = {TensorProto.FLOAT: ("float_data", 1), TensorProto.DOUBLE: ("double_data", 1),
                 TensorProto.INT64: ("int64_data", 1), TensorProto.UINT64: ("uint64_data", 1),
                 TensorProto.UINT32: ("uint64_data", 1), TensorProto.COMPLEX64: ("float_data", 2),
                 TensorProto.COMPLEX128: ("double_data", 2), TensorProto.STRING: ("string_data", 1)}
_TYPED_FIELDS.update({t: ("int32_data", 1) for t in (TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
                                                     TensorProto.UINT16, TensorProto.UINT8, TensorProto.BOOL,
                                                     TensorProto.FLOAT16, TensorProto.BFLOAT16)})


def _declared_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes the tensor's dims and type declare (0 for types of no fixed width)."""
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return 0
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize if tensor.data_type != TensorProto.STRING else 0


def _check_initializer(tensor: onnx.TensorProto, what: str) -> None:
    """The data an initializer holds must match the shape and type it declares (before anything allocates it)."""
    if any(d < 0 for d in tensor.dims):
        raise UnsupportedModelError(f"{what}: initializer {tensor.name!r} has negative dims {list(tensor.dims)}")
    if tensor.data_type not in _TYPED_FIELDS:
        return  # 4-bit and float8 types are packed: left to onnxruntime
    if tensor.data_location == TensorProto.EXTERNAL:
        return  # checked against its file by load_model
    count = int(np.prod(tensor.dims, dtype=np.int64))
    if tensor.HasField("raw_data"):
        held, declared = len(tensor.raw_data), _declared_bytes(tensor)
        unit = "bytes"
    else:
        field, per = _TYPED_FIELDS[tensor.data_type]
        held, declared = len(getattr(tensor, field)), count * per
        unit = "values"
    if held != declared:
        shape = "x".join(map(str, tensor.dims)) or "scalar"
        raise UnsupportedModelError(
            f"{what}: initializer {tensor.name!r} declares shape {shape} of "
            f"{TensorProto.DataType.Name(tensor.data_type)} ({declared} {unit}) but holds {held} {unit}: "
            "the file is corrupted or was edited by hand")


def check_loadable(model: onnx.ModelProto, what: str = "model_onnx") -> None:
    """Raise :class:`UnsupportedModelError` if the installed onnxruntime cannot load ``model``.

    Checked before anything is built: a graph with outputs, the IR version, an opset for every domain the nodes
    use and within what onnxruntime supports, every node input defined, and initializers holding exactly the
    data their shape and type declare.
    """
    if not model.HasField("graph") or not model.graph.output:
        raise UnsupportedModelError(f"{what} has no graph outputs (an empty or truncated model?)")
    limit = max_ir_version()
    if model.ir_version > limit:
        raise UnsupportedModelError(
            f"{what} has ONNX IR version {model.ir_version}; {runtime_name()} reads at most "
            f"{limit}. Export it again with an older onnx (or skl2onnx target_opset<={MAX_OPSET}), "
            f"or set model.ir_version = {limit} if it uses no newer feature."
        )
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version > MAX_OPSET:
            raise UnsupportedModelError(
                f"{what} uses opset {opset.version} of the default domain; ortflow trains graphs of opset at "
                f"most {MAX_OPSET}. Convert it with target_opset={MAX_OPSET} (skl2onnx) or "
                f"onnx.version_converter.convert_version(model, {MAX_OPSET})."
            )
    opsets = {o.domain if o.domain != "ai.onnx" else "": o.version for o in model.opset_import}
    for domain, version in opsets.items():
        if domain in MAX_DOMAIN_OPSET and version > MAX_DOMAIN_OPSET[domain]:
            raise UnsupportedModelError(
                f"{what} imports opset {version} of domain {domain!r}; onnxruntime-training 1.19.2 supports at "
                f"most {MAX_DOMAIN_OPSET[domain]}")
    used = {n.domain if n.domain != "ai.onnx" else "" for n in model.graph.node}
    missing = sorted(used - set(opsets))
    if missing:
        raise UnsupportedModelError(
            f"{what} has nodes of domains {missing} but no opset_import for them: add "
            f"onnx.helper.make_opsetid(domain, version) to model.opset_import")
    defined = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer} | {""}
    defined |= {o for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        unknown = [i for i in node.input if i not in defined]
        if unknown:
            raise UnsupportedModelError(
                f"{what}: node {node.name or node.op_type!r} (op {node.op_type}) reads {unknown}, which no graph "
                "input, initializer or node defines")
    for tensor in model.graph.initializer:
        _check_initializer(tensor, what)


def get_initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """All initializers of the main graph as numpy arrays, by name."""
    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}


def trainable_initializers(model: onnx.ModelProto) -> list[str]:
    """Names of the float initializers (the ones a gradient can train), in graph order."""
    return [init.name for init in model.graph.initializer if init.data_type in FLOAT_TYPES]


def batch_norm_statistics(model: onnx.ModelProto) -> set[str]:
    """Initializers read only as a BatchNormalization's running mean or variance (its inputs 3 and 4): statistics
    of the data, not weights a gradient should move (training a variance by gradient can make it negative)."""
    uses: dict[str, list[bool]] = {}
    for node in model.graph.node:
        for position, name in enumerate(node.input):
            uses.setdefault(name, []).append(node.op_type == "BatchNormalization" and position in (3, 4))
    outputs = {o.name for o in model.graph.output}
    return {init.name for init in model.graph.initializer
            if init.name in uses and all(uses[init.name]) and init.name not in outputs}


def float_weight_count(model: onnx.ModelProto) -> int:
    """How many values the float initializers of the main graph hold together."""
    return sum(int(np.prod(init.dims)) for init in model.graph.initializer if init.data_type in FLOAT_TYPES)


def replace_initializers(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """Copy of ``model`` whose initializers named in ``values`` hold the new values (dtype and shape kept)."""
    new = onnx.ModelProto()
    new.CopyFrom(model)
    known = {init.name: init for init in new.graph.initializer}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise KeyError(f"replace_initializers: no initializer named {unknown}; graph has {sorted(known)}")
    for name, value in values.items():
        old = known[name]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(old.data_type)
        array = np.asarray(value, dtype=dtype)
        if tuple(array.shape) != tuple(old.dims):
            raise ValueError(f"replace_initializers: {name!r} has shape {tuple(old.dims)}, value has {array.shape}")
        old.CopyFrom(numpy_helper.from_array(array, name))
    return new


def output_names(model: onnx.ModelProto) -> list[str]:
    return [o.name for o in model.graph.output]


def input_names(model: onnx.ModelProto) -> list[str]:
    """Graph inputs that are not initializers (the feeds)."""
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def all_names(model: onnx.ModelProto) -> set[str]:
    """Every tensor name used in the main graph."""
    names = {i.name for i in model.graph.input} | {o.name for o in model.graph.output}
    names |= {i.name for i in model.graph.initializer}
    for node in model.graph.node:
        names.update(n for n in node.input if n)
        names.update(n for n in node.output if n)
    return names


def initializers_as_inputs(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """Copy of ``model`` where the initializers ``names`` become graph inputs (after the existing ones), fed at
    every run instead of stored."""
    names = set(names)
    new = onnx.ModelProto()
    new.CopyFrom(model)
    declared = {i.name for i in new.graph.input}
    kept = []
    for init in new.graph.initializer:
        if init.name not in names:
            kept.append(init)
        elif init.name not in declared:
            new.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    del new.graph.initializer[:]
    new.graph.initializer.extend(kept)
    return new


def keep_outputs(model: onnx.ModelProto, outputs: Iterable[str]) -> onnx.ModelProto:
    """Copy of ``model`` computing only ``outputs``: unused nodes, initializers and inputs are removed."""
    outputs = list(outputs)
    by_name = {o.name: o for o in model.graph.output}
    missing = [o for o in outputs if o not in by_name]
    if missing:
        raise KeyError(f"keep_outputs: no graph output {missing}; outputs are {list(by_name)}")
    needed = set(outputs)
    kept_nodes = []
    for node in reversed(model.graph.node):
        if needed.intersection(node.output):
            kept_nodes.append(node)
            needed.update(n for n in node.input if n)
            for att in node.attribute:  # names read by subgraphs (If/Loop/Scan)
                if att.type == onnx.AttributeProto.GRAPH:
                    needed |= all_names(onnx.helper.make_model(att.g))
    kept_nodes.reverse()
    graph = onnx.helper.make_graph(
        kept_nodes,
        model.graph.name,
        [i for i in model.graph.input if i.name in needed],
        [by_name[o] for o in outputs],
        [i for i in model.graph.initializer if i.name in needed],
        value_info=[v for v in model.graph.value_info if v.name in needed],
    )
    new = onnx.helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    new.producer_name = model.producer_name or "ortflow"
    new.doc_string = model.doc_string
    return new


def elem_type(model: onnx.ModelProto, name: str) -> int:
    """Element type of a graph input or output."""
    for value in list(model.graph.input) + list(model.graph.output):
        if value.name == name:
            return value.type.tensor_type.elem_type
    raise KeyError(f"{name!r} is neither an input nor an output of the graph")


def type_name(model: onnx.ModelProto, name: str) -> str:
    """The element type of a graph input or output as onnx names it, lower case (``float16``, ``double``)."""
    return TensorProto.DataType.Name(elem_type(model, name)).lower()


def shape_of(model: onnx.ModelProto, name: str) -> list[int | str | None]:
    """Declared shape of a graph input or output (ints, symbolic names or None)."""
    for value in list(model.graph.input) + list(model.graph.output):
        if value.name == name:
            dims = value.type.tensor_type.shape.dim
            return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims]
    raise KeyError(f"{name!r} is neither an input nor an output of the graph")


def safe_join(folder: str | os.PathLike, name: str) -> Path:
    """``folder/name``, refusing names that would land outside ``folder`` (``..``, absolute paths)."""
    root = Path(folder).resolve()
    target = (root / name).resolve()
    if os.path.isabs(name) or not target.is_relative_to(root):
        raise UnsafePathError(f"file name {name!r} escapes the output folder {str(root)!r}")
    return target


def save_graphs(graphs: Mapping[str, onnx.ModelProto | bytes], folder: str | os.PathLike) -> dict[str, str]:
    """Write each of ``graphs`` (name -> graph, or its serialized bytes) into ``folder`` as ``<name>.onnx``, making
    the folder if needed and refusing a name that escapes it; return name -> path."""
    os.makedirs(folder, exist_ok=True)
    paths = {}
    for name, model in graphs.items():
        path = safe_join(folder, f"{name}.onnx")
        path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
        paths[name] = str(path)
    return paths


def relu_as_mask(model: onnx.ModelProto) -> onnx.ModelProto:
    """Copy of ``model`` where float/double ``Relu(x)`` nodes compute ``x * Cast(x > 0)`` instead.

    The values are the same (except ``Relu(-inf) = 0`` becomes NaN); the gradient changes kernels. onnxruntime
    1.19's CPU ``ReluGrad`` is a scalar Eigen ``select``, ~20x slower than ``Relu`` itself (190 µs against 10 µs on
    256 x 256 floats); the rewritten node's gradient is one vectorized ``Mul`` by the mask. The trainers apply it
    to the graphs they train on CPU; the prediction graph (``get_trained_onnx``) keeps its ``Relu``.
    """
    is_relu = [n.op_type == "Relu" and n.domain in ("", "ai.onnx") for n in model.graph.node]
    if not any(is_relu):
        return model
    types = _elem_types(model)
    new = onnx.ModelProto()
    new.CopyFrom(model)
    taken = all_names(model) | {n.name for n in model.graph.node}

    def fresh(base: str) -> str:
        return _fresh(base, taken)

    zeros: dict[int, str] = {}
    nodes = []
    for node, relu in zip(new.graph.node, is_relu):
        dtype = types.get(node.input[0]) if relu else None
        if dtype not in (TensorProto.FLOAT, TensorProto.DOUBLE):
            nodes.append(node)
            continue
        if dtype not in zeros:
            zeros[dtype] = fresh("ortflow_relu_zero")
            value = numpy_helper.from_array(np.zeros((), dtype=onnx.helper.tensor_dtype_to_np_dtype(dtype)), zeros[dtype])
            nodes.insert(0, onnx.helper.make_node("Constant", [], [zeros[dtype]], value=value,
                                                  name=fresh("ortflow_relu_zero_node")))
        x, y = node.input[0], node.output[0]
        base = node.name or y
        positive, mask = fresh(f"{y}_positive"), fresh(f"{y}_mask")
        nodes += [
            onnx.helper.make_node("Greater", [x, zeros[dtype]], [positive], name=fresh(f"{base}_greater")),
            onnx.helper.make_node("Cast", [positive], [mask], to=dtype, name=fresh(f"{base}_cast")),
            onnx.helper.make_node("Mul", [x, mask], [y], name=fresh(f"{base}_mask")),
        ]
    del new.graph.node[:]
    new.graph.node.extend(nodes)
    return new


def fused_matmul_for_double(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself, or, when a graph input is double, a copy whose ``com.microsoft`` ``FusedMatMul`` nodes
    compute ``Einsum``.

    onnxruntime 1.19's gradient builder writes the gradient of ``MatMul`` as ``FusedMatMul`` (transposed operands),
    whose CPU kernel exists for float only: a float64 training graph could not be loaded. Einsum has a double kernel.
    """
    if not any(i.type.tensor_type.elem_type == TensorProto.DOUBLE for i in model.graph.input):
        return model
    if not any(n.op_type == "FusedMatMul" and n.domain == "com.microsoft" for n in model.graph.node):
        return model
    new = onnx.ModelProto()
    new.CopyFrom(model)
    nodes = []
    for node in new.graph.node:
        if node.op_type != "FusedMatMul" or node.domain != "com.microsoft":
            nodes.append(node)
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("transBatchA") or attrs.get("transBatchB") or float(attrs.get("alpha", 1.0)) != 1.0:
            raise UnsupportedModelError(f"node {node.name!r}: FusedMatMul {attrs} has no double kernel in "
                                        "onnxruntime 1.19 and no Einsum rewrite in ortflow")
        left = "...ji" if attrs.get("transA") else "...ij"
        right = "...kj" if attrs.get("transB") else "...jk"
        nodes.append(onnx.helper.make_node("Einsum", list(node.input), list(node.output), name=node.name + "_einsum",
                                           equation=f"{left},{right}->...ik"))
    del new.graph.node[:]
    new.graph.node.extend(nodes)
    return new


def row_sums_as_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself, or a copy where each ``ReduceSum`` over the rows of a float/double matrix of static shape
    ``(N, k)`` (axes ``[0]``) computes ``MatMul(ones(N), x)`` (``ones(1, N)`` when it keeps the axis).

    The values are the same up to summation order. onnxruntime 1.19's CPU ``ReduceSum`` over the first axis takes
    83 µs on 256 x 256 floats, the MatMul 4 µs: the bias gradients onnxruntime's gradient builder writes for a
    training graph built for static shapes (:meth:`ortflow.trainers.fwbw.OrtGradientForwardBackward.static_agent`).
    """
    shapes = {v.name: v.type.tensor_type for v in list(model.graph.value_info) + list(model.graph.input)
              if v.type.HasField("tensor_type")}
    inits = {i.name: i for i in model.graph.initializer}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)

    def row_sum(node: onnx.NodeProto) -> tuple[int, int, bool] | None:
        """(N, element type, keepdims) when ``node`` sums the rows of a static (N, k) float matrix."""
        if node.op_type != "ReduceSum" or node.domain not in ("", "ai.onnx") or node.input[0] not in shapes:
            return None
        tensor = shapes[node.input[0]]
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        if tensor.elem_type not in (TensorProto.FLOAT, TensorProto.DOUBLE) or len(dims) != 2 or None in dims:
            return None
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if opset >= 13:
            if len(node.input) < 2 or node.input[1] not in inits:
                return None
            axes = numpy_helper.to_array(inits[node.input[1]]).reshape(-1).tolist()
        else:
            axes = list(attrs.get("axes", []))
        if axes not in ([0], [-2]):
            return None
        return dims[0], tensor.elem_type, bool(attrs.get("keepdims", 1))

    found = [row_sum(n) for n in model.graph.node]
    if not any(found):
        return model
    new = onnx.ModelProto()
    new.CopyFrom(model)
    taken = all_names(model) | {n.name for n in model.graph.node}
    ones: dict[tuple, str] = {}
    nodes = []
    for node, spec in zip(new.graph.node, found):
        if spec is None:
            nodes.append(node)
            continue
        rows, dtype, keep = spec
        if (rows, dtype, keep) not in ones:
            name = ones[rows, dtype, keep] = _fresh(f"ortflow_ones_{rows}", taken)
            value = np.ones((1, rows) if keep else (rows,), dtype=onnx.helper.tensor_dtype_to_np_dtype(dtype))
            new.graph.initializer.append(numpy_helper.from_array(value, name))
        nodes.append(onnx.helper.make_node("MatMul", [ones[rows, dtype, keep], node.input[0]], list(node.output),
                                           name=_fresh(f"{node.name or node.output[0]}_matmul", taken)))
    del new.graph.node[:]
    new.graph.node.extend(nodes)
    return new


def _fresh(base: str, taken: set) -> str:
    """``base``, or ``base_<i>``, not in ``taken`` (then added to it)."""
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor that onnx's shape inference (or the graph itself) types."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # an op onnx does not know (com.microsoft...): use what the graph declares
        inferred = model.graph
    types = {i.name: i.data_type for i in model.graph.initializer}
    for value in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    return types


def pick_output(model: onnx.ModelProto, choice: int | str | None, argument: str = "output_name",
                first: bool = False) -> str:
    """The output a loss applies to: ``choice`` by name or position, else the only output, else ``raw_score``
    (the score before the sigmoid/softmax of ortflow's classifier graphs); with ``first``, None picks the first
    output (a gradient's target). ``argument`` names the parameter in errors."""
    names = output_names(model)
    if choice is None and first:
        return names[0]
    if isinstance(choice, str):
        if choice not in names:
            raise ValueError(f"{argument}={choice!r} is not an output; outputs are {names}")
        return choice
    if isinstance(choice, (int, np.integer)) and not isinstance(choice, bool):
        if not -len(names) <= choice < len(names):
            raise ValueError(f"{argument}={choice} is out of range: the graph has {len(names)} outputs {names}")
        return names[choice]
    if choice is not None:
        raise TypeError(f"{argument} must be an int, a str or None, not {type(choice).__name__}")
    if len(names) == 1:
        return names[0]
    if "raw_score" in names:
        return "raw_score"
    raise ValueError(f"the graph has {len(names)} outputs {names}: choose one with {argument}")
