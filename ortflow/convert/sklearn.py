"""scikit-learn models to trainable ONNX graphs.

Linear models and MLPs are written directly as MatMul/Add/activation graphs, so every weight is a named float
initializer and every node has a gradient. A single-layer model (a linear model) names its weights ``coef`` and
``intercept``, as onnxcustom's documents use them; a multi-layer model (an MLP) names layer ``i``'s
``coef_<i>`` and ``intercept_<i>``.

Classifiers expose three outputs: ``output_label`` (the classes as scikit-learn has them), ``output_probability``
(float32 (N, k)) and ``raw_score``, the scores before the sigmoid or softmax that training uses: (N, 1) for two
classes, (N, k) for k >= 3. The classes are the initializer ``classes`` (int64 or string), read back by
:func:`graph_classes`. A scikit-learn Pipeline ending in such a model is one graph: its preprocessing converted by
skl2onnx (one input per column for a DataFrame), then ortflow's graph of the estimator. Other models go through
skl2onnx.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .._ort import MAX_OPSET
from ..exceptions import UnsupportedModelError
from ..graph.editing import ModelLike, check_loadable, load_model

INPUT_NAME = "X"
REGRESSION_OUTPUT = "variable"
LABEL_OUTPUT = "output_label"
PROBA_OUTPUT = "output_probability"
RAW_SCORE_OUTPUT = "raw_score"
CLASSES_NAME = "classes"
#: metadata key under which :func:`to_onnx` records the estimator a graph comes from (class and settings), from which
#: :func:`ortflow.add_loss_output` picks the estimator's own loss and penalty
ESTIMATOR_METADATA = "ortflow.estimator"
#: fitted attributes that decide a loss, by estimator class (HuberRegressor's scale)
_FITTED_LOSS_ATTRIBUTES = {"HuberRegressor": ("scale_",)}
IR_VERSION = 8  # any IR <= 10 works; 8 matches opset 15-17 era tools and stays readable by older runtimes.

_ACTIVATIONS = {"relu": "Relu", "tanh": "Tanh", "logistic": "Sigmoid", "identity": None}
# attributes by which ai.onnx.ml classifiers (LinearClassifier, TreeEnsembleClassifier, SVMClassifier...) carry classes
_ML_CLASS_ATTRIBUTES = ("classlabels_ints", "classlabels_int64s", "classlabels_strings")


def to_onnx(model: Any, X: np.ndarray | None = None, target_opset: int = 17) -> onnx.ModelProto:
    """Convert a fitted scikit-learn model into an ONNX graph ortflow can train.

    ``X`` (a sample of the inputs) is only needed by the skl2onnx fallback. Written directly: LinearRegression,
    Ridge, Lasso, ElasticNet, SGDRegressor and other linear regressors, MLPRegressor, LogisticRegression (binary or
    multinomial), other binary linear classifiers (probabilities are the sigmoid of the decision function) and
    MLPClassifier (binary or multi-class), and a Pipeline ending in one of them (its preprocessing converted by
    skl2onnx, then ortflow's graph of the estimator: a classifier keeps ``raw_score``). The graph's metadata records the estimator (:func:`record_estimator`),
    from which :func:`ortflow.add_loss_output` picks its own loss and penalty.
    """
    if target_opset > MAX_OPSET:
        raise ValueError(f"target_opset={target_opset}: onnxruntime-training 1.19.2 supports at most {MAX_OPSET}")
    onx = _convert(model, X, target_opset)
    record_estimator(onx, model)
    return onx


def _convert(model: Any, X: np.ndarray | None, target_opset: int) -> onnx.ModelProto:
    if _writes_own(model):
        return _own_graph(model, target_opset)
    steps = getattr(model, "steps", None)
    if steps and _writes_own(steps[-1][1]):
        # a Pipeline ending in a model ortflow writes: skl2onnx converts the preprocessing, ortflow the estimator
        # (a classifier keeps raw_score, which training needs; skl2onnx's whole graph has only labels and ZipMap)
        head = _own_graph(steps[-1][1], target_opset)
        if all(step in (None, "passthrough") for _, step in steps[:-1]):
            return head
        return _chained(_skl2onnx(model[:-1], X, target_opset), head, target_opset)
    return _skl2onnx(model, X, target_opset)


def _writes_own(model: Any) -> bool:
    """Whether ortflow writes ``model``'s graph itself: an MLP, or a linear regressor or classifier."""
    from sklearn.base import is_classifier, is_regressor
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    if isinstance(model, (MLPRegressor, MLPClassifier)):
        return True
    linear = hasattr(model, "coef_") and hasattr(model, "intercept_")
    return linear and (is_classifier(model) or is_regressor(model))


def _own_graph(model: Any, target_opset: int) -> onnx.ModelProto:
    """ortflow's own graph of a model :func:`_writes_own` accepts."""
    from sklearn.base import is_classifier
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    if isinstance(model, MLPRegressor):
        if model.out_activation_ != "identity":
            raise ValueError(f"MLPRegressor with out_activation_={model.out_activation_!r} is not supported")
        return _build(list(zip(model.coefs_, model.intercepts_)), model.activation, None, target_opset)
    if isinstance(model, MLPClassifier):
        if model.out_activation_ == "logistic" and len(model.classes_) != 2:
            raise UnsupportedModelError(
                f"MLPClassifier fitted on a multilabel target ({len(model.classes_)} independent outputs) is not "
                "supported: ortflow's classifiers predict one class per sample"
            )
        return _build(list(zip(model.coefs_, model.intercepts_)), model.activation, model.classes_, target_opset)
    if is_classifier(model):
        _check_multinomial(model)
        return _build([_linear_layer(model)], None, model.classes_, target_opset)
    return _build([_linear_layer(model)], None, None, target_opset)


def _chained(prep: onnx.ModelProto, head: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """One graph: ``prep`` (a Pipeline's preprocessing converted by skl2onnx, one float matrix out) feeding the
    input ``X`` of ``head`` (ortflow's own graph of the Pipeline's estimator). The head keeps its names (weights
    ``coef``/``intercept``, its outputs); tensors of the preprocessing that would clash with them are renamed."""
    if len(prep.graph.output) != 1:
        raise UnsupportedModelError(
            f"the Pipeline's preprocessing has {len(prep.graph.output)} outputs; ortflow's estimator graph reads one "
            "feature matrix")
    prep_inputs = {i.name for i in prep.graph.input}
    head_fixed = {i.name for i in head.graph.initializer} | {o.name for o in head.graph.output}
    clash = sorted(prep_inputs & head_fixed)
    if clash:
        raise ValueError(f"column names {clash} are names the estimator's graph needs (its weights and outputs): "
                         "rename those columns")
    head_names = _tensor_names(head.graph) | {n.name for n in head.graph.node}
    fresh = _namer(head_names | _tensor_names(prep.graph) | {n.name for n in prep.graph.node}, "_prep")

    prep_graph = onnx.GraphProto()
    prep_graph.CopyFrom(prep.graph)
    _rename(prep_graph, {n: fresh(n) for n in _tensor_names(prep_graph) - prep_inputs if n in head_names})
    for node in prep_graph.node:
        if node.name in head_names:
            node.name = fresh(node.name)
    head_graph = onnx.GraphProto()
    head_graph.CopyFrom(head.graph)
    _rename(head_graph, {n: fresh(n) for n in _tensor_names(head_graph) - head_fixed - {INPUT_NAME}
                         if n in prep_inputs})
    features = prep_graph.output[0]
    nodes = list(prep_graph.node)
    source = features.name
    if features.type.tensor_type.elem_type != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", [source], [fresh("features")], name=fresh("features_cast"),
                                      to=TensorProto.FLOAT))
        source = nodes[-1].output[0]
    _rename(head_graph, {INPUT_NAME: source})
    nodes.extend(head_graph.node)
    graph = helper.make_graph(nodes, "ortflow_pipeline", list(prep_graph.input), list(head_graph.output),
                              list(prep_graph.initializer) + list(head_graph.initializer),
                              value_info=list(prep_graph.value_info))
    opsets = {"": opset}
    for entry in prep.opset_import:
        if entry.domain not in ("", "ai.onnx"):
            opsets[entry.domain] = max(opsets.get(entry.domain, 1), entry.version)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
                              ir_version=max(IR_VERSION, min(prep.ir_version, 10)))
    model.producer_name = "ortflow"
    check_loadable(model)
    return model


def _namer(taken: set[str], suffix: str):
    """A function giving a name not in ``taken`` (``name + suffix``, then with 1, 2... after it), added there."""

    def fresh(name: str) -> str:
        k = 0
        while f"{name}{suffix}{k or ''}" in taken:
            k += 1
        taken.add(f"{name}{suffix}{k or ''}")
        return f"{name}{suffix}{k or ''}"

    return fresh


def _tensor_names(graph: onnx.GraphProto) -> set[str]:
    names = {v.name for v in (*graph.input, *graph.output, *graph.value_info, *graph.initializer)}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
    names.discard("")
    return names


def _rename(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    """Rename tensors of ``graph`` (not inside subgraphs: the converters ortflow chains write none)."""
    if not mapping:
        return
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
    for value in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
        value.name = mapping.get(value.name, value.name)


def record_estimator(onx: onnx.ModelProto, model: Any) -> None:
    """Write into ``onx``'s metadata (key :data:`ESTIMATOR_METADATA`) the class of ``model`` (the last step of a
    Pipeline), its settings that are plain values (numbers, strings, booleans, None) and the fitted attributes
    that decide its loss."""
    import json

    estimator = model.steps[-1][1] if hasattr(model, "steps") else model
    params = {k: v for k, v in estimator.get_params(deep=False).items()
              if v is None or isinstance(v, (bool, int, float, str))}
    fitted = {k: float(getattr(estimator, k)) for k in _FITTED_LOSS_ATTRIBUTES.get(type(estimator).__name__, ())}
    record = {"class": type(estimator).__name__, "params": params, "fitted": fitted}
    for entry in onx.metadata_props:
        if entry.key == ESTIMATOR_METADATA:
            entry.value = json.dumps(record)
            return
    entry = onx.metadata_props.add()
    entry.key, entry.value = ESTIMATOR_METADATA, json.dumps(record)


def estimator_record(model: ModelLike) -> dict:
    """What :func:`to_onnx` recorded about the estimator a graph comes from ({} when nothing was)."""
    import json

    for entry in load_model(model).metadata_props:
        if entry.key == ESTIMATOR_METADATA:
            return json.loads(entry.value)
    return {}


def _linear_layer(model: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(coef (n_features, n_outputs), intercept (n_outputs,))`` of a linear model: a 1-D ``coef_`` (one output,
    as a binary RidgeClassifier or a LinearRegression on one target has it) is one column."""
    coef = np.asarray(model.coef_)
    coef = coef.reshape(-1, 1) if coef.ndim == 1 else coef.T
    intercept = np.broadcast_to(np.asarray(model.intercept_, dtype=np.float64), (coef.shape[1],))
    return coef, intercept


def _check_multinomial(model: Any) -> None:
    """Multi-class linear classifiers other than a multinomial LogisticRegression score one-vs-rest."""
    from sklearn.linear_model import LogisticRegression

    if len(model.classes_) <= 2:
        return
    if not isinstance(model, LogisticRegression) or getattr(model, "multi_class", "multinomial") == "ovr":
        raise UnsupportedModelError(
            f"{type(model).__name__} with {len(model.classes_)} classes scores each class one-vs-rest; ortflow's "
            "multi-class graphs are softmax (multinomial): use LogisticRegression (multinomial) or MLPClassifier"
        )


def weight_names(n_layers: int) -> list[tuple[str, str]]:
    """Names of the (coefficient, intercept) initializers of each layer: ``coef``/``intercept`` for one layer,
    ``coef_<i>``/``intercept_<i>`` for several."""
    if n_layers == 1:
        return [("coef", "intercept")]
    return [(f"coef_{i}", f"intercept_{i}") for i in range(n_layers)]


def graph_classes(model: ModelLike) -> np.ndarray | None:
    """The classes a classifier graph carries, in the order of its probability columns; None for a regressor.

    Read from the initializer ``classes`` (graphs of :func:`to_onnx` and :func:`ortflow.make_trainable`), else from
    the class-label attributes of an ``ai.onnx.ml`` classifier. Integer classes come back as int64, string classes
    as a numpy string array.
    """
    model = load_model(model)
    for init in model.graph.initializer:
        if init.name == CLASSES_NAME:
            return _decoded(numpy_helper.to_array(init))
    for node in model.graph.node:
        classes = node_classes(node)
        if classes is not None:
            return classes
    return None


def node_classes(node: onnx.NodeProto) -> np.ndarray | None:
    """The class labels an ``ai.onnx.ml`` classifier node carries as attributes, or None."""
    for attr in node.attribute:
        if attr.name in _ML_CLASS_ATTRIBUTES and (attr.ints or attr.strings):
            return _decoded(np.array(helper.get_attribute_value(attr)))
    return None


def _decoded(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind in "OSU":
        return np.array([v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values.ravel()])
    return values.astype(np.int64).ravel()


def classes_initializer(classes: np.ndarray) -> onnx.TensorProto:
    """The initializer ``classes``: int64 for integer (or integral float) classes, string otherwise.

    A float initializer would be trained as a weight, so non-integral float classes are refused.
    """
    classes = np.asarray(classes)
    if classes.dtype.kind in "iub" or (classes.dtype.kind == "f" and np.array_equal(classes, np.round(classes))):
        return numpy_helper.from_array(classes.astype(np.int64), CLASSES_NAME)
    if classes.dtype.kind == "f":
        raise UnsupportedModelError(
            f"classes {classes.tolist()} are non-integral floats: fit the model on integer or string labels"
        )
    values = [str(c).encode("utf-8") for c in classes]
    return helper.make_tensor(CLASSES_NAME, TensorProto.STRING, [len(values)], values)


def linear_nodes(x: str, layers, names, hidden_activation: str | None, output: str, prefix: str = ""):
    """Nodes and float initializers of ``layers`` [(coef (n_in, n_out), intercept (n_out,))] applied to ``x``:
    MatMul + Add per layer, ``hidden_activation`` between layers, the last Add writing ``output``; ``prefix``
    starts the names of the intermediate tensors and of the nodes."""
    nodes, inits = [], []
    current = x
    for i, ((coef, intercept), (coef_name, intercept_name)) in enumerate(zip(layers, names)):
        last = i == len(layers) - 1
        inits.append(numpy_helper.from_array(np.asarray(coef, dtype=np.float32), coef_name))
        inits.append(numpy_helper.from_array(np.asarray(intercept, dtype=np.float32).reshape(-1), intercept_name))
        matmul, pre = f"{prefix}matmul_{i}", f"{prefix}pre_{i}"
        nodes.append(helper.make_node("MatMul", [current, coef_name], [matmul], name=matmul))
        out = output if last else f"{prefix}linear_{i}"
        activation = None if last else _ACTIVATIONS[hidden_activation]
        if activation is None:
            nodes.append(helper.make_node("Add", [matmul, intercept_name], [out], name=f"{prefix}add_{i}"))
        else:
            nodes.append(helper.make_node("Add", [matmul, intercept_name], [pre], name=f"{prefix}add_{i}"))
            nodes.append(helper.make_node(activation, [pre], [out], name=f"{prefix}activation_{i}"))
        current = out
    return nodes, inits


def classifier_head(classes: np.ndarray, score_columns: int | None = None):
    """Nodes, initializers and graph outputs mapping ``raw_score`` to labels and probabilities.

    Two classes: ``raw_score`` (N, 1), probabilities [1 - sigmoid, sigmoid], label ``classes[raw > 0]`` (an ArgMax
    over [-raw, raw]). k >= 3 classes, or two classes scored by two columns (``score_columns=2``: the logits of a
    network exported from PyTorch): ``raw_score`` (N, k), probabilities its softmax, label ``classes[argmax(raw)]``.
    """
    init = classes_initializer(classes)
    k = len(classes)
    if k < 2:
        raise UnsupportedModelError(f"a classifier needs at least two classes, the model has {k}")
    node = helper.make_node
    binary = k == 2 and score_columns != 2
    if binary:
        one = numpy_helper.from_array(np.array([1.0], dtype=np.float32))
        nodes = [
            node("Constant", [], ["head_one"], name="head_one", value=one),
            node("Sigmoid", [RAW_SCORE_OUTPUT], ["head_proba1"], name="head_sigmoid"),
            node("Sub", ["head_one", "head_proba1"], ["head_proba0"], name="head_complement"),
            node("Concat", ["head_proba0", "head_proba1"], [PROBA_OUTPUT], name="head_probability", axis=1),
            node("Neg", [RAW_SCORE_OUTPUT], ["head_negated"], name="head_negated"),
            node("Concat", ["head_negated", RAW_SCORE_OUTPUT], ["head_scores"], name="head_scores", axis=1),
            node("ArgMax", ["head_scores"], ["head_index"], name="head_argmax", axis=1, keepdims=0),
        ]
    else:
        nodes = [
            node("Softmax", [RAW_SCORE_OUTPUT], [PROBA_OUTPUT], name="head_softmax", axis=1),
            node("ArgMax", [RAW_SCORE_OUTPUT], ["head_index"], name="head_argmax", axis=1, keepdims=0),
        ]
    nodes.append(node("Gather", [CLASSES_NAME, "head_index"], [LABEL_OUTPUT], name="head_label", axis=0))
    outputs = [
        helper.make_tensor_value_info(LABEL_OUTPUT, init.data_type, [None]),
        helper.make_tensor_value_info(PROBA_OUTPUT, TensorProto.FLOAT, [None, k]),
        helper.make_tensor_value_info(RAW_SCORE_OUTPUT, TensorProto.FLOAT, [None, 1 if binary else k]),
    ]
    return nodes, [init], outputs


def _build(layers, hidden_activation: str | None, classes, opset: int) -> onnx.ModelProto:
    n_features = layers[0][0].shape[0]
    output = REGRESSION_OUTPUT if classes is None else RAW_SCORE_OUTPUT
    nodes, inits = linear_nodes(INPUT_NAME, layers, weight_names(len(layers)), hidden_activation, output)
    inputs = [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [None, n_features])]
    if classes is None:
        outputs = [helper.make_tensor_value_info(REGRESSION_OUTPUT, TensorProto.FLOAT, [None, layers[-1][0].shape[1]])]
    else:
        head_nodes, head_inits, outputs = classifier_head(np.asarray(classes))
        nodes, inits = nodes + head_nodes, inits + head_inits
    graph = helper.make_graph(nodes, "ortflow_model", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)
    model.producer_name = "ortflow"
    onnx.checker.check_model(model)
    return model


def _skl2onnx(model: Any, X: np.ndarray | None, target_opset: int) -> onnx.ModelProto:
    from skl2onnx import to_onnx as skl_to_onnx

    from .tables import register_converters

    register_converters()
    if X is None:
        raise ValueError(f"to_onnx: {type(model).__name__} goes through skl2onnx, which needs a sample X")
    if hasattr(X, "columns") and hasattr(X, "dtypes"):
        sample = {"initial_types": table_input_types(X)}
    else:
        sample = {"X": np.asarray(X[:1], dtype=np.float32)}
    try:
        onx = skl_to_onnx(model, **sample, target_opset={"": target_opset, "ai.onnx.ml": 3},
                          black_op={"LinearRegressor", "LinearClassifier"})
    except Exception as exc:
        empty = _empty_columns(X)
        if empty:  # scikit-learn's imputers drop a column without values; skl2onnx's graph keeps it and fails
            raise ValueError(f"to_onnx: column(s) {empty} hold no value (every cell missing): drop them before "
                             "fitting, or impute with SimpleImputer(keep_empty_features=True)") from exc
        raise
    if "initial_types" in sample:
        _columns_as_inputs(onx, [name for name, _ in sample["initial_types"]])
    if onx.ir_version > 10:
        onx.ir_version = 10
    check_loadable(onx)
    return onx


def _columns_as_inputs(onx: onnx.ModelProto, columns: list[str]) -> None:
    """Name the graph's inputs as the frame's columns. skl2onnx cleans a column's name into its input's
    (``area m2`` -> ``area_m2``, ``Unnamed: 0`` -> ``Unnamed__0``, ``a.b`` and ``a/b`` -> ``a_b`` and ``a_b1``)
    while the data keeps it: one name for both, the column's, which any string may be in ONNX. skl2onnx declares
    the inputs in the order of its initial types; a tensor of the graph already holding a column's name is renamed
    first."""
    weights = {i.name for i in onx.graph.initializer}
    inputs = [i.name for i in onx.graph.input if i.name not in weights]
    if len(inputs) != len(columns):  # pragma: no cover - skl2onnx keeps one input per initial type
        raise UnsupportedModelError(f"skl2onnx made the inputs {inputs} of the columns {columns}")
    mapping = {old: new for old, new in zip(inputs, columns) if old != new}
    others = _tensor_names(onx.graph) - set(inputs)
    fresh = _namer(others | set(columns), "_renamed")
    _rename(onx.graph, {name: fresh(name) for name in others & set(mapping.values())})
    _rename(onx.graph, mapping)


def _empty_columns(X) -> list[str]:
    """The columns of a frame whose every cell is missing."""
    if not hasattr(X, "columns"):
        return []
    return [str(c) for c in X.columns if X[c].isna().all()]


def _warn_non_numbers(column, name: str) -> None:
    """A warning when a text column is numbers but for a few cells: it is converted (and trained) as text."""
    import warnings

    from .tables import describe_cells, non_numbers

    bad = non_numbers(column)
    if bad is not None:
        warnings.warn(f"column {name!r} is text, yet numbers but for {int(bad.sum())} of {len(bad)} cells "
                      f"({describe_cells(column, bad)}): it becomes a text input (one level per value); to use it "
                      f"as a number, read those cells as gaps first, e.g. pandas.to_numeric(df[{name!r}], "
                      "errors='coerce') or read_csv(..., na_values=['?'])", UserWarning, stacklevel=4)


def table_input_types(frame) -> list[tuple]:
    """skl2onnx's initial types of a DataFrame: one ``(n, 1)`` input per column, named as the column: float for
    numbers, int64 for integers and booleans, int64 days since 1970-01-01 for dates (:mod:`ortflow.convert.tables`), text
    for strings and categories (:mod:`ortflow.data.inputs` feeds them). A text column whose cells are numbers but for a
    few (``?`` among numbers, :func:`ortflow.convert.tables.non_numbers`) is taken as text, with a warning naming those
    cells."""
    from skl2onnx.common.data_types import FloatTensorType, Int64TensorType, StringTensorType

    names = [str(c) for c in frame.columns]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"the frame has several columns named {repeated}: each column becomes a graph input of its "
                         "name, so names must be unique; rename or drop the repeated columns")
    types = []
    for index, (name, dtype) in enumerate(zip(frame.columns, frame.dtypes)):
        kind = getattr(dtype, "kind", "O")
        if kind == "f":
            tensor = FloatTensorType([None, 1])
        elif kind in "iubM":
            tensor = Int64TensorType([None, 1])
        elif kind in "OSU" or str(dtype) in ("category", "string"):
            tensor = StringTensorType([None, 1])
            _warn_non_numbers(frame.iloc[:, index], str(name))
        else:
            raise TypeError(f"column {name!r} has dtype {dtype}, which ortflow's graphs do not take; convert it "
                            "before converting the model")
        types.append((str(name), tensor))
    return types
