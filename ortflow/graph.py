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

from ._ort import MAX_OPSET, max_ir_version, runtime_name
from .exceptions import UnsafePathError, UnsupportedModelError

ModelLike = Union[onnx.ModelProto, bytes, str, os.PathLike]

FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)


def load_model(model: ModelLike) -> onnx.ModelProto:
    """Return a ModelProto from a ModelProto, serialized bytes or a file path.

    A file whose external data points outside its folder is refused (:class:`UnsafePathError`).
    """
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"model_onnx: no ONNX file at {str(path)!r}")
        proto = onnx.load(str(path), load_external_data=False)
        _check_external_data(proto, path.parent)
        onnx.load_external_data_for_model(proto, str(path.parent))
        return proto
    raise TypeError(f"model_onnx must be an onnx.ModelProto, bytes or a path, not {type(model).__name__}")


def _check_external_data(proto: onnx.ModelProto, folder: Path) -> None:
    root = folder.resolve()
    for tensor in proto.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        location = {e.key: e.value for e in tensor.external_data}.get("location", "")
        target = (root / location).resolve()
        if os.path.isabs(location) or not target.is_relative_to(root):
            raise UnsafePathError(
                f"initializer {tensor.name!r} stores its data at {location!r}, outside the model's folder {str(root)!r}"
            )


def check_loadable(model: onnx.ModelProto, what: str = "model_onnx") -> None:
    """Raise :class:`UnsupportedModelError` if the installed onnxruntime cannot load ``model``."""
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


def get_initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """All initializers of the main graph as numpy arrays, by name."""
    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}


def trainable_initializers(model: onnx.ModelProto) -> list[str]:
    """Names of the float initializers (the ones a gradient can train), in graph order."""
    return [init.name for init in model.graph.initializer if init.data_type in FLOAT_TYPES]


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
        name, i = base, 0
        while name in taken:
            i += 1
            name = f"{base}_{i}"
        taken.add(name)
        return name

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


def pick_output(model: onnx.ModelProto, choice: int | str | None, argument: str = "output_name") -> str:
    """The output a loss applies to: ``choice`` by name or position, else the only output, else ``raw_score``
    (the score before the sigmoid/softmax of ortflow's classifier graphs). ``argument`` names the parameter in
    errors."""
    names = output_names(model)
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
