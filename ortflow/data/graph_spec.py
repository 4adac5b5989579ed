"""What a trainer feeds and reads (:class:`GraphSpec`: the graph's data inputs, label, weight and outputs) and the
arrays it trains on (:class:`TrainData`), with the checks that tie data to a graph: the targets a classifier graph
takes, the width and feature names fit saw, a symbolic output width made concrete."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from ..graph import editing as g
from .._ort import InferenceSession
from ..convert.sklearn import graph_classes
from .inputs import InputMapping
from ..runtime.sessions import make_session_options
from ..runtime.validation import encode_labels


@dataclass
class GraphSpec:
    """What a trainer feeds and reads: input, label, weight and prediction outputs."""

    inputs: InputMapping
    label_shape: list = field(default_factory=lambda: [None])
    weight_name: str | None = None
    prediction_outputs: list[str] = field(default_factory=list)
    trained_output: str | None = None  # the output the loss applies to (what predict returns for a regressor)
    classes: np.ndarray | None = None  # the classes of a classifier graph trained on its raw score

    @property
    def x_name(self) -> str:
        """The first data input (the only one but for tables)."""
        return self.inputs.names[0]

    @property
    def n_features(self) -> int | None:
        return self.inputs.n_features


@dataclass
class TrainData:
    """Validated arrays, converted once per fit and sliced per batch: ``feeds`` (one array per data input of the
    graph, see :mod:`ortflow.data.inputs`), float32 targets ``y`` and ``weight``."""

    feeds: dict[str, np.ndarray]
    y: np.ndarray
    weight: np.ndarray | None = None

    @property
    def n_samples(self) -> int:
        return len(self.y)

    @property
    def X(self) -> np.ndarray:
        """The feed of a graph with one data input."""
        if len(self.feeds) != 1:
            raise ValueError(f"the graph has {len(self.feeds)} data inputs {list(self.feeds)}, not one X")
        return next(iter(self.feeds.values()))

    def take(self, index) -> TrainData:
        w = None if self.weight is None else self.weight[index]
        return TrainData({k: v[index] for k, v in self.feeds.items()}, self.y[index], w)


def prediction_spec(model: onnx.ModelProto, output_name, weight_name: str | None) -> GraphSpec:
    """The spec of a prediction graph (no loss inside) trained on one float output: ``output_name`` picks it
    (None: the only one, or ``raw_score`` when present); sample weights enter as ``weight_name`` (default
    ``'weight'``). Shared by the trainers that add the loss themselves."""
    output = g.pick_output(model, output_name, "output_name")
    if g.elem_type(model, output) != onnx.TensorProto.FLOAT:
        raise ValueError(f"output {output!r} is {g.type_name(model, output)}, not float32: only float32 predictions "
                         "can be trained; convert the graph to float32 (its weights, inputs and casts) first")
    shape = g.shape_of(model, output)
    if len(shape) not in (1, 2):
        raise ValueError(f"output {output!r} has rank {len(shape)}; the losses expect (N,) or (N, k)")
    return GraphSpec(inputs=InputMapping.of(model), label_shape=shape, weight_name=weight_name or "weight",
                     prediction_outputs=g.output_names(model), trained_output=output)


def trained_classes(model: onnx.ModelProto, spec: GraphSpec) -> np.ndarray | None:
    """The classes a graph carries when the trained output is its raw score (not probabilities or labels)."""
    if spec.trained_output in ("output_probability", "output_label", "probabilities", "label"):
        return None
    return graph_classes(model)


def encoded_targets(spec: GraphSpec, y):
    """What the loss takes for ``y``: class labels encoded for a classifier graph, ``y`` itself otherwise."""
    if spec.classes is None:
        return y
    width = spec.label_shape[1] if len(spec.label_shape) == 2 and isinstance(spec.label_shape[1], int) else None
    return encode_labels(y, spec.classes, width)


def fitted_width(trainer) -> int | None:
    """The matrix width fit saw, when the graph leaves it symbolic (None for tables and fixed widths)."""
    inputs = trainer._spec.inputs
    return trainer.n_features_in_ if inputs.n_features is None and not inputs.is_table else None


def fitted_names(trainer) -> list[str] | None:
    names = getattr(trainer, "feature_names_in_", None)
    return None if names is None else list(names)


def matrix_width(spec: GraphSpec, feeds: dict[str, np.ndarray]) -> int | None:
    """The width of a single matrix input (the graph may leave it symbolic), None for any other input."""
    if spec.inputs.is_table:
        return None
    array = next(iter(feeds.values()))
    return array.shape[1] if array.ndim == 2 else None


def n_features_of(spec: GraphSpec, feeds: dict[str, np.ndarray]) -> int:
    """scikit-learn's ``n_features_in_``: the matrix's width, the number of columns of a table, the number of values
    of one sample otherwise (an image's pixels)."""
    if spec.inputs.is_table:
        return len(feeds)
    array = next(iter(feeds.values()))
    return int(np.prod(array.shape[1:], dtype=np.int64))


def resolve_symbolic_width(model: onnx.ModelProto, spec: GraphSpec, feeds: dict[str, np.ndarray]) -> None:
    """A trained output whose column count is symbolic gets its real width from a run on one row, so a ``y`` of
    another width is refused instead of broadcast against it (a 1-column model would learn the mean of 2 columns)."""
    if len(spec.label_shape) != 2 or isinstance(spec.label_shape[1], int) or spec.trained_output is None:
        return
    pruned = g.keep_outputs(model, [spec.trained_output])
    sess = InferenceSession(pruned.SerializeToString(), make_session_options(1), providers=["CPUExecutionProvider"])
    output = sess.run([spec.trained_output], {k: v[:1] for k, v in feeds.items()})[0]
    if output.ndim == 2:
        spec.label_shape = [spec.label_shape[0], int(output.shape[1])]
