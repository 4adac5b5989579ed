"""The training-package format, defined once: the manifest and the state header as typed records, read from JSON
(every type, null, bound and cross-reference checked, a :class:`TrainingPackageError` naming the field otherwise),
written back to JSON, and the JSON Schema generated from them for the JavaScript library.

A record is a dataclass whose annotations say what each JSON value may be: ``str``, ``bool``, :data:`Count` (an
integer, never a boolean, from 0 to below 2**53: JavaScript's safe integers), :data:`Number` (a finite number),
:data:`Dim` (a count, a symbolic axis name or null), ``Literal[...]``, ``X | None``, ``list[X]``, ``dict[str, X]``,
:data:`Json` (any finite JSON value) or another record. A field with a default may be left out; a key the record
does not know is refused (a misspelled field is not silently dropped). :meth:`Manifest.from_json` then checks the
fields against each other (:meth:`Manifest.check`): the state table's offsets and lengths follow each other and
add up to ``state.bytes``, the step graphs take and give the state tensors' shapes, the prediction graph's weight
patches lie inside ``predict.onnx`` and hold their tensor's bytes. The graphs themselves are compared with the
manifest by :func:`ortflow.package.graphs.check_graph` once read.

``python -m ortflow.package.format --write`` writes the schema (``js/src/manifest.schema.json``) and the ES module
``js/src/schema.js`` that exports it with the format's constants; ``--check`` exits 1 when they are out of date
(tests/test_package_format.py does the same).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from ..exceptions import TrainingPackageError
from ..data.shuffle import GENERATOR  # the shuffle generator every runtime implements

FORMAT = "ortflow-training-package"
FORMAT_VERSION = 1
STATE_FORMAT = "ortflow-training-state"
STATE_MAGIC = b"OFTS"
MANIFEST = "manifest.json"
STEP_FILE, PREDICT_FILE, LOSS_FILE, STATE_FILE = "step.onnx", "predict.onnx", "loss.onnx", "state.bin"
FLAT_STEP_FILE = "step_flat.onnx"
#: the flat step graph's whole state, in and out (the state tensors one after the other, ``state.bin``'s layout)
FLAT_STATE, FLAT_UPDATED = "state", "state_updated"
#: the unrolled step graphs' file name (``K`` steps) and their output of the ``K`` losses
UNROLLED_FILE, UNROLLED_LOSSES = "steps_{}.onnx", "losses"
#: the largest count a manifest or a state holds, excluded: JavaScript's integers are exact below it
MAX_COUNT = 2 ** 53
#: the largest state header read (bytes): a header is a table of names and shapes, far below it
MAX_HEADER = 1 << 26

Count = Annotated[int, "count"]
Number = Annotated[float, "number"]
Json = Annotated[Any, "json"]
Dim = Union[Count, str, None]
Label = Union[str, Number, bool]

#: the roles of a graph's inputs and outputs as the manifest writes them
ROLES = ("data", "target", "sample_weight", "weight", "slot", "learning_rate", "step", "state", "loss", "losses",
         "prediction")


def _is_record(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _json_name(f: dataclasses.Field) -> str:
    return f.metadata.get("json", f.name)


@dataclass
class Record:
    """A typed JSON object: :meth:`from_json` checks and converts, :meth:`to_json` writes back."""

    @classmethod
    def from_json(cls, value, path: str = ""):
        return _load(cls, value, path)

    def to_json(self) -> dict:
        return _dump(self)


# --- the manifest ---------------------------------------------------------------------------------------------
@dataclass
class TensorSpec(Record):
    """An input or output of a graph: its name, dtype, shape (null: unknown rank) and, for the step graphs, its
    role (``data``, ``target``, ``sample_weight``, ``weight``, ``slot``, ``learning_rate``, ``step``, ``state``;
    outputs ``loss``, ``losses``, ``state``)."""

    name: str
    shape: list[Dim] | None
    dtype: str
    role: Literal[ROLES] | None = None  # type: ignore[valid-type]


@dataclass
class Target(TensorSpec):
    """The step graph's target input and how labels become its values."""

    classes: list[Label] | None = None
    encoding: Literal["value", "binary", "one_hot"] = "value"


@dataclass
class StepGraph(Record):
    file: str
    batch_axis: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    loss_output: str


@dataclass
class FlatStepGraph(Record):
    file: str
    batch_axis: str
    state_input: str
    state_output: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


@dataclass
class UnrolledGraph(Record):
    file: str
    steps: Count
    rows: Count
    state_input: str
    state_output: str
    losses_output: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


@dataclass
class Loss(Record):
    output: str
    name: str | None
    params: dict[str, Json]


@dataclass
class Optimizer(Record):
    name: str
    class_: str = field(metadata={"json": "class"})
    params: dict[str, Json] = field(default_factory=dict)
    slots: list[str] = field(default_factory=list)
    reads_step: bool = False


@dataclass
class Schedule(Record):
    name: str
    eta0: Number
    power_t: Number
    alpha: Number
    per: Literal["epoch"] = "epoch"
    of: Literal["rows_seen"] = "rows_seen"


@dataclass
class StateTensor(Record):
    """A state tensor in ``state.bin`` (and in a state file): ``length`` float32 values at byte ``offset``."""

    name: str
    shape: list[Count]
    offset: Count
    length: Count
    dtype: Literal["float32"] = "float32"


@dataclass
class StateTable(Record):
    file: str
    bytes: Count
    tensors: list[StateTensor]
    weights: list[str]
    dtype: Literal["float32"] = "float32"
    byte_order: Literal["little"] = "little"


@dataclass
class Progress(Record):
    epochs: Count = 0
    steps: Count = 0
    rows_seen: Count = 0


@dataclass
class Patch(Record):
    """Where a trained weight's float32 values lie in ``predict.onnx``."""

    name: str
    shape: list[Count]
    offset: Count
    bytes: Count


@dataclass
class PredictGraph(Record):
    file: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    weights: list[Patch]


@dataclass
class LossModel(Record):
    file: str
    label: str
    weight: str | None


@dataclass
class Affine(Record):
    """``(x - mean) / scale`` on the graph input ``input``, per column (one value each, or one for all)."""

    input: str
    mean: list[Number]
    scale: list[Number]


@dataclass
class Preprocess(Record):
    """What the graphs do to the data before the model, and what they cannot do. ``features``: the data input's
    standardization, inside the step graphs (single, flat, unrolled), ``loss.onnx`` and ``predict.onnx``;
    ``target``: the target's, inside the step graphs and ``loss.onnx`` (the loss is computed on the standardized
    target, as the Python trainer computed it); ``prediction``: the outputs of ``predict.onnx`` (and of
    ``loss.onnx``) given back in the target's units, ``value * scale + mean`` of ``target``. A runtime feeds the
    rows as the user has them: nothing to apply for these. ``columns`` (a table's raw columns, name -> kind
    ``number``, ``bool``, ``text``, ``date``) and ``text_missing`` declare what no graph does: the runtime converts
    each cell by its column's kind (numbers and booleans float32, a gap NaN; text as it is, a gap
    ``text_missing``; dates int64 days since 1970-01-01) before feeding it."""

    features: Affine | None = None
    target: Affine | None = None
    prediction: list[str] = field(default_factory=list)
    columns: dict[str, str] | None = None
    text_missing: str | None = None


@dataclass
class Shuffle(Record):
    generator: Literal[GENERATOR]  # type: ignore[valid-type]
    seed: str = "uint32"
    epoch: str = "epochs completed before, from 0"
    module: str = "ortflow.data.shuffle"


@dataclass
class FileEntry(Record):
    sha256: str
    bytes: Count


@dataclass
class Manifest(Record):
    """``manifest.json`` (docs/TRAINING_OUTSIDE_PYTHON.md describes each field)."""

    format: Literal[FORMAT]  # type: ignore[valid-type]
    format_version: Literal[FORMAT_VERSION]  # type: ignore[valid-type]
    package_id: str
    trainer: str
    ir_version: Count
    batch_size: Count
    step: StepGraph
    step_flat: FlatStepGraph
    data_inputs: list[TensorSpec]
    target: Target
    sample_weight: str | None
    loss: Loss
    optimizer: Optimizer
    schedule: Schedule
    state: StateTable
    progress: Progress
    predict: PredictGraph
    loss_model: LossModel
    shuffle: Shuffle
    feature_names: list[str] | None = None
    unrolled: list[UnrolledGraph] = field(default_factory=list)
    preprocess: Preprocess = field(default_factory=Preprocess)
    metadata: dict[str, Json] = field(default_factory=dict)
    files: dict[str, FileEntry] = field(default_factory=dict)

    @classmethod
    def from_json(cls, value, path: str = "") -> Manifest:
        """The manifest of the JSON value ``value``: its format and version first (a clear refusal of another
        one), then every field, then the fields against each other."""
        if isinstance(value, dict):
            if value.get("format") != FORMAT:
                raise TrainingPackageError(f"format: the manifest has format {value.get('format')!r}, not {FORMAT!r}")
            version = value.get("format_version")
            if type(version) is not int or version != FORMAT_VERSION:
                raise TrainingPackageError(f"format_version: the manifest has format_version {version!r}; this "
                                           f"ortflow reads version {FORMAT_VERSION}")
        manifest = _load(cls, value, path)
        fill_roles(manifest)
        manifest.check()
        return manifest

    def check(self) -> None:
        """The fields against each other (see the module's docstring); :class:`TrainingPackageError` naming the
        first field that disagrees."""
        _fail_if(self.batch_size < 1, "batch_size", f"{self.batch_size} must be at least 1")
        tensors = self.state.tensors
        by_name: dict[str, StateTensor] = {}
        offset = 0
        for i, t in enumerate(tensors):
            where = f"state.tensors[{i}]"
            _fail_if(t.name in by_name, f"{where}.name", f"{t.name!r} is listed twice")
            by_name[t.name] = t
            _fail_if(t.length != _size(t.shape), f"{where}.length",
                     f"{t.length} values, but the shape {t.shape} holds {_size(t.shape)}")
            _fail_if(t.offset != offset, f"{where}.offset",
                     f"{t.offset}: the tensors lie one after the other, this one at byte {offset}")
            offset += 4 * t.length
        _fail_if(self.state.bytes != offset, "state.bytes",
                 f"{self.state.bytes}, but the state tensors hold {offset} bytes")
        _fail_if(offset >= MAX_COUNT, "state.bytes", f"{offset} bytes is not below 2**53")
        seen = set()
        for i, w in enumerate(self.state.weights):
            _fail_if(w not in by_name, f"state.weights[{i}]", f"{w!r} is not a state tensor")
            _fail_if(w in seen, f"state.weights[{i}]", f"{w!r} is listed twice")
            seen.add(w)
        for name, where in [(self.step.file, "step.file"), (self.step_flat.file, "step_flat.file"),
                            (self.predict.file, "predict.file"), (self.loss_model.file, "loss_model.file"),
                            (self.state.file, "state.file"),
                            *((u.file, f"unrolled[{i}].file") for i, u in enumerate(self.unrolled))]:
            _fail_if(name not in self.files, where, f"{name!r} is not listed in files")
        _fail_if(self.files[self.state.file].bytes != self.state.bytes, f"files[{self.state.file!r}].bytes",
                 f"{self.files[self.state.file].bytes}, but state.bytes is {self.state.bytes}")
        self._check_step(by_name)
        total = offset // 4
        self._check_flat("step_flat", self.step_flat, total)
        for i, u in enumerate(self.unrolled):
            where = f"unrolled[{i}]"
            _fail_if(u.steps < 2, f"{where}.steps", f"{u.steps} must be at least 2")
            _fail_if(u.rows != u.steps * self.batch_size, f"{where}.rows",
                     f"{u.rows}, but {u.steps} steps of batch_size {self.batch_size} take {u.steps * self.batch_size}")
            self._check_flat(where, u, total)
            losses = _find(u.outputs, u.losses_output, f"{where}.outputs", "losses_output")
            _fail_if(losses[1].shape != [u.steps], f"{where}.outputs[{losses[0]}].shape",
                     f"{losses[1].shape}, but {u.steps} losses come out")
        self._check_predict(by_name)
        names = {i.name for i in self.step.inputs}
        for i, d in enumerate(self.data_inputs):
            _fail_if(d.name not in names, f"data_inputs[{i}].name", f"{d.name!r} is not an input of the step graph")
        _fail_if(self.target.name not in names, "target.name",
                 f"{self.target.name!r} is not an input of the step graph")
        _fail_if(self.sample_weight is not None and self.sample_weight not in names, "sample_weight",
                 f"{self.sample_weight!r} is not an input of the step graph")
        if self.target.encoding != "value":
            _fail_if(not self.target.classes, "target.classes", f"a {self.target.encoding} target needs its classes")
        self._check_preprocess()
        for name in self.files:
            _fail_if(name in ("", ".") or name.startswith("/") or "\\" in name or ".." in name.split("/"),
                     f"files[{name!r}]", "names a file outside the package")

    def _check_step(self, by_name: dict[str, StateTensor]) -> None:
        state = [(i, s) for i, s in enumerate(self.step.inputs) if s.role in ("weight", "slot")]
        _fail_if([s.name for _, s in state] != list(by_name), "step.inputs",
                 f"the weight and slot inputs {[s.name for _, s in state]} are not the state tensors {list(by_name)}")
        for i, s in state:
            _fail_if(s.shape != by_name[s.name].shape, f"step.inputs[{i}].shape",
                     f"{s.shape}, but the state tensor {s.name!r} has shape {by_name[s.name].shape}")
        outputs = self.step.outputs
        _fail_if(not outputs or outputs[0].name != self.step.loss_output, "step.outputs[0].name",
                 f"the step's first output is its loss {self.step.loss_output!r}")
        _fail_if(len(outputs) != 1 + len(by_name), "step.outputs",
                 f"{len(outputs)} outputs: the loss and {len(by_name)} updated state tensors come out")
        for i, (o, t) in enumerate(zip(outputs[1:], by_name.values()), start=1):
            _fail_if(o.shape != t.shape, f"step.outputs[{i}].shape",
                     f"{o.shape}, but the state tensor {t.name!r} has shape {t.shape}")

    def _check_preprocess(self) -> None:
        p = self.preprocess
        for key, affine, allowed in (("features", p.features, {d.name: d for d in self.data_inputs}),
                                     ("target", p.target, {self.target.name: self.target})):
            if affine is None:
                continue
            where = f"preprocess.{key}"
            _fail_if(affine.input not in allowed, f"{where}.input",
                     f"{affine.input!r} is not {'a data input' if key == 'features' else 'the target input'} of the "
                     f"step graph ({sorted(allowed)})")
            _fail_if(len(affine.scale) != len(affine.mean) or not affine.mean, f"{where}.scale",
                     f"{len(affine.scale)} values for {len(affine.mean)} means (one or more each, as many)")
            _fail_if(any(s == 0 for s in affine.scale), f"{where}.scale", "a scale of 0 divides by zero")
            shape = allowed[affine.input].shape or []
            width = shape[-1] if len(shape) >= 2 else 1
            _fail_if(isinstance(width, int) and len(affine.mean) not in (1, width), f"{where}.mean",
                     f"{len(affine.mean)} values, but {affine.input!r} has {width} columns")
        outputs = {o.name for o in self.predict.outputs}
        for i, name in enumerate(p.prediction):
            _fail_if(name not in outputs, f"preprocess.prediction[{i}]", f"{name!r} is not an output of predict")
        _fail_if(bool(p.prediction) and p.target is None, "preprocess.prediction",
                 "outputs in the target's units need preprocess.target")

    def _check_flat(self, where: str, entry, total: int) -> None:
        i, spec = _find(entry.inputs, entry.state_input, f"{where}.inputs", "state_input")
        _fail_if(spec.shape != [total], f"{where}.inputs[{i}].shape",
                 f"{spec.shape}, but the state holds {total} values")
        i, spec = _find(entry.outputs, entry.state_output, f"{where}.outputs", "state_output")
        _fail_if(spec.shape != [total], f"{where}.outputs[{i}].shape",
                 f"{spec.shape}, but the state holds {total} values")

    def _check_predict(self, by_name: dict[str, StateTensor]) -> None:
        size = self.files[self.predict.file].bytes
        ranges = []
        for i, p in enumerate(self.predict.weights):
            where = f"predict.weights[{i}]"
            _fail_if(p.name not in self.state.weights, f"{where}.name", f"{p.name!r} is not a trained weight")
            t = by_name[p.name]
            _fail_if(p.shape != t.shape, f"{where}.shape", f"{p.shape}, but the state tensor has shape {t.shape}")
            _fail_if(p.bytes != 4 * t.length, f"{where}.bytes",
                     f"{p.bytes}, but the weight {p.name!r} holds {4 * t.length} bytes")
            _fail_if(p.offset + p.bytes > size, f"{where}.offset",
                     f"bytes {p.offset} to {p.offset + p.bytes} lie outside {self.predict.file!r} ({size} bytes)")
            ranges.append((p.offset, p.offset + p.bytes, i))
        ranges.sort()
        for (_, end, _), (start, _, i) in zip(ranges, ranges[1:]):
            _fail_if(start < end, f"predict.weights[{i}].offset", "overlaps another weight's bytes")


def _find(specs: list[TensorSpec], name: str, where: str, key: str) -> tuple[int, TensorSpec]:
    for i, s in enumerate(specs):
        if s.name == name:
            return i, s
    raise TrainingPackageError(f"{where}: no entry named {name!r} (its {key})")


def fill_roles(m: Manifest) -> None:
    """Give every input and output of the graphs its role where the manifest left it out (packages written before
    roles were written for every graph): the step graph's roles by name, ``state`` for the flat state."""
    roles = {s.name: s.role for s in m.step.inputs if s.role}
    for s in m.step.outputs:
        s.role = s.role or ("loss" if s.name == m.step.loss_output else "state")
    entries = [m.step_flat, *m.unrolled]
    for entry in entries:
        for s in entry.inputs:
            s.role = s.role or ("state" if s.name == entry.state_input else roles.get(s.name, "data"))
        for s in entry.outputs:
            s.role = s.role or ("state" if s.name == entry.state_output else
                                "losses" if s.name == getattr(entry, "losses_output", None) else "loss")
    for s in m.predict.inputs:
        s.role = s.role or "data"
    for s in m.predict.outputs:
        s.role = s.role or "prediction"


def inputs_by_role(entry, role: str) -> list[TensorSpec]:
    """The inputs of a graph entry (``manifest.step``, ``.step_flat``, an ``.unrolled[i]``, ``.predict``) with
    ``role``, in order."""
    return [s for s in entry.inputs if s.role == role]


def outputs_by_role(entry, role: str) -> list[TensorSpec]:
    return [s for s in entry.outputs if s.role == role]


# --- the state file's header ----------------------------------------------------------------------------------
@dataclass
class StateEntry(Record):
    name: str
    shape: list[Count]
    offset: Count
    length: Count


@dataclass
class StateHeader(Record):
    """The JSON header of a state file (:mod:`ortflow.package.state`); keys it does not know are kept in
    ``extra``."""

    format: Literal[STATE_FORMAT]  # type: ignore[valid-type]
    format_version: Literal[FORMAT_VERSION]  # type: ignore[valid-type]
    package_id: str
    tensors: list[StateEntry]
    epochs: Count = 0
    steps: Count = 0
    rows_seen: Count = 0
    rows: Count = 0
    extra: dict[str, Json] = field(default_factory=dict, metadata={"rest": True})

    @classmethod
    def from_json(cls, value, path: str = "") -> StateHeader:
        if isinstance(value, dict):
            found, version = value.get("format"), value.get("format_version")
            if found != STATE_FORMAT or type(version) is not int or version != FORMAT_VERSION:
                raise TrainingPackageError(f"format_version: the state has format {found!r} version {version!r}; "
                                           f"this ortflow reads {STATE_FORMAT!r} version {FORMAT_VERSION}")
        header = _load(cls, value, path)
        names = set()
        for i, t in enumerate(header.tensors):
            _fail_if(t.name in names, f"tensors[{i}].name", f"{t.name!r} is listed twice")
            names.add(t.name)
            _fail_if(t.length != _size(t.shape), f"tensors[{i}].length",
                     f"{t.length} values, but the shape {t.shape} holds {_size(t.shape)}")
        return header


# --- reading and writing records ------------------------------------------------------------------------------
def _fail_if(bad: bool, path: str, message: str) -> None:
    if bad:
        raise TrainingPackageError(f"{path}: {message}")


def _size(shape: list[int]) -> int:
    """The number of values of ``shape``, a Python int (never wraps)."""
    return math.prod(shape)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _describe(value) -> str:
    text = json.dumps(value, allow_nan=True, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls, globalns=vars(sys.modules[__name__]), include_extras=True)


def _load(tp, value, path: str):
    """``value`` checked against the type ``tp`` (see the module's docstring) and converted (records built)."""
    where = path or "the manifest"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        kind = tp.__metadata__[0]
        if kind == "count":
            if type(value) is not int:
                if isinstance(value, float) and value.is_integer() and 0 <= value < MAX_COUNT:
                    return int(value)  # JSON writers may write 3.0
                raise TrainingPackageError(f"{where}: {_describe(value)} is not a count (an integer >= 0)")
            _fail_if(not 0 <= value < MAX_COUNT, where, f"{value} is not a count from 0 to below 2**53")
            return value
        if kind == "number":
            _fail_if(type(value) not in (int, float) or not math.isfinite(value), where,
                     f"{_describe(value)} is not a finite number")
            return value
        _check_json(value, path)
        return value
    if origin in (Union, types.UnionType):
        for option in args:
            try:
                return _load(option, value, path)
            except TrainingPackageError:
                pass
        raise TrainingPackageError(f"{where}: {_describe(value)} is not {_type_words(tp)}")
    if tp is type(None):
        _fail_if(value is not None, where, f"{_describe(value)} is not null")
        return None
    if origin is Literal:
        _fail_if(not any(type(value) is type(a) and value == a for a in args), where,
                 f"{_describe(value)} is not one of {list(args)}")
        return value
    if tp is str:
        _fail_if(not isinstance(value, str), where, f"{_describe(value)} is not a string")
        return value
    if tp is bool:
        _fail_if(type(value) is not bool, where, f"{_describe(value)} is not true or false")
        return value
    if origin is list:
        _fail_if(not isinstance(value, list), where, f"{_describe(value)} is not a list")
        return [_load(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _fail_if(not isinstance(value, dict), where, f"{_describe(value)} is not an object")
        return {k: _load(args[1], v, f"{path}[{k!r}]") for k, v in value.items()}
    if _is_record(tp):
        _fail_if(not isinstance(value, dict), where, f"{_describe(value)} is not an object")
        hints, fields, known, rest = _hints(tp), dataclasses.fields(tp), set(), None
        kwargs = {}
        for f in fields:
            if f.metadata.get("rest"):
                rest = f
                continue
            key = _json_name(f)
            known.add(key)
            if key not in value:
                _fail_if(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
                         _join(path, key), "is missing")
                continue
            kwargs[f.name] = _load(hints[f.name], value[key], _join(path, key))
        unknown = [k for k in value if k not in known]
        if rest is not None:
            kwargs[rest.name] = {k: _load(Json, value[k], _join(path, k)) for k in unknown}
        else:
            _fail_if(bool(unknown), _join(path, unknown[0]) if unknown else path,
                     f"is not a field of {tp.__name__} (known: {sorted(known)})")
        return tp(**kwargs)
    raise TypeError(f"no rule for the type {tp!r}")  # pragma: no cover


def _check_json(value, path: str) -> None:
    if isinstance(value, float):
        _fail_if(not math.isfinite(value), path or "the value", f"{value} is not a finite number")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_json(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            _fail_if(not isinstance(k, str), path, f"the key {k!r} is not a string")
            _check_json(v, f"{path}[{k!r}]")
    else:
        _fail_if(value is not None and not isinstance(value, (str, int, bool)), path,
                 f"{value!r} is not a JSON value")


def _type_words(tp) -> str:
    schema = _schema(tp, {})
    options = schema.get("anyOf", [schema])
    words = []
    for s in options:
        if "$ref" in s:
            words.append("an object")
        elif "const" in s:
            words.append(json.dumps(s["const"]))
        else:
            words.append({"integer": "a count", "number": "a number", "string": "a string", "null": "null",
                          "boolean": "true or false", "array": "a list", "object": "an object"}.get(s.get("type"),
                                                                                                    "a value"))
    return " or ".join(words)


def _dump(value):
    if _is_record(type(value)):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.metadata.get("rest"):
                out.update({k: _dump(v) for k, v in item.items()})
            elif not (f.name == "role" and item is None):
                out[_json_name(f)] = _dump(item)
        return out
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


# --- the JSON Schema ------------------------------------------------------------------------------------------
def _schema(tp, defs: dict) -> dict:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        kind = tp.__metadata__[0]
        if kind == "count":
            return {"type": "integer", "minimum": 0, "maximum": MAX_COUNT - 1}
        if kind == "number":
            return {"type": "number"}
        return {}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema(a, defs) for a in args]}
    if tp is type(None):
        return {"type": "null"}
    if origin is Literal:
        return {"const": args[0]} if len(args) == 1 else {"enum": list(args)}
    if tp is str:
        return {"type": "string"}
    if tp is bool:
        return {"type": "boolean"}
    if origin is list:
        return {"type": "array", "items": _schema(args[0], defs)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(args[1], defs)}
    if _is_record(tp):
        if tp.__name__ not in defs:
            defs[tp.__name__] = None  # placeholder: records may refer to each other
            hints, props, required, rest = _hints(tp), {}, [], False
            for f in dataclasses.fields(tp):
                if f.metadata.get("rest"):
                    rest = True
                    continue
                props[_json_name(f)] = _schema(hints[f.name], defs)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    required.append(_json_name(f))
            defs[tp.__name__] = {"type": "object", "properties": props, "required": required,
                                 "additionalProperties": {} if rest else False}
        return {"$ref": f"#/$defs/{tp.__name__}"}
    raise TypeError(f"no rule for the type {tp!r}")  # pragma: no cover


def json_schema() -> dict:
    """The JSON Schema (2020-12) of the manifest (and, under ``$defs.StateHeader``, of the state header), with the
    format's constants under ``x-ortflow``."""
    defs: dict = {}
    root = _schema(Manifest, defs)
    _schema(StateHeader, defs)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "ortflow-training-package.schema.json",
            "title": "ortflow training package manifest", **root,
            "x-ortflow": {"FORMAT": FORMAT, "FORMAT_VERSION": FORMAT_VERSION, "STATE_FORMAT": STATE_FORMAT,
                          "STATE_MAGIC": STATE_MAGIC.decode("ascii"), "GENERATOR": GENERATOR,
                          "MAX_COUNT": MAX_COUNT, "MAX_HEADER": MAX_HEADER},
            "$defs": dict(sorted(defs.items()))}


ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "js" / "src" / "manifest.schema.json"
SCHEMA_MODULE = ROOT / "js" / "src" / "schema.js"


def generated() -> dict[Path, str]:
    """The generated files and their text."""
    schema = json_schema()
    text = json.dumps(schema, indent=1) + "\n"
    module = (
        "// Generated by `python -m ortflow.package.format --write` from ortflow/package/format.py: do not edit.\n"
        "// The JSON Schema of a training package's manifest (and its state header) and the format's constants.\n"
        f"export const SCHEMA = {json.dumps(schema, indent=1)};\n"
        f"export const FORMAT = {json.dumps(FORMAT)};\n"
        f"export const FORMAT_VERSION = {FORMAT_VERSION};\n"
        f"export const STATE_FORMAT = {json.dumps(STATE_FORMAT)};\n"
        f"export const STATE_MAGIC = {json.dumps(STATE_MAGIC.decode('ascii'))};\n"
        f"export const GENERATOR = {json.dumps(GENERATOR)};\n"
        f"export const MAX_HEADER = {MAX_HEADER};\n")
    return {SCHEMA_FILE: text, SCHEMA_MODULE: module}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    stale = [p for p, text in generated().items() if not p.is_file() or p.read_text() != text]
    if "--write" in args:
        for path, text in generated().items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return 0
    if "--check" in args:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is out of date: run python -m ortflow.package.format --write")
        return 1 if stale else 0
    print(json.dumps(json_schema(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
