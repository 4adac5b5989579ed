"""``ai.onnx.ml`` linear ops rewritten as MatMul/Add, so that a graph straight from skl2onnx can be trained.

skl2onnx writes LinearRegression and LogisticRegression as ``LinearRegressor`` / ``LinearClassifier``, whose weights
are node attributes: no gradient reaches them. :func:`make_trainable` replaces those nodes by the graphs
:func:`ortflow.to_onnx` writes, with float initializers ``coef``/``intercept`` and, for a classifier, the outputs
``output_label``, ``output_probability`` and ``raw_score``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from .sklearn import RAW_SCORE_OUTPUT, classifier_head, linear_nodes, node_classes, weight_names
from ..exceptions import UnsupportedModelError
from ..graph.editing import ModelLike, all_names, check_loadable, load_model

ML_DOMAIN = "ai.onnx.ml"
DEFAULT_OPSET = 17
# what may follow a LinearClassifier's outputs on their way to the graph outputs: steps that keep the values
_LABEL_STEPS = {"Cast", "Identity"}
_PROBA_STEPS = {"Normalizer", "ZipMap", "Identity", "Cast"}


def make_trainable(model: ModelLike, weights_to_train: Sequence[str] | None = None) -> onnx.ModelProto:
    """A graph whose ``ai.onnx.ml`` LinearRegressor / LinearClassifier nodes are rewritten as MatMul/Add.

    The weights become float initializers named ``coef``/``intercept`` (``coef_<i>``/``intercept_<i>`` when the
    graph holds several such nodes). A LinearClassifier, with the Cast/Identity after its label and the
    Normalizer/ZipMap after its probabilities, becomes the classifier of :func:`ortflow.to_onnx`: outputs
    ``output_label`` (int64 or string classes, from the initializer ``classes``), ``output_probability`` (float32
    (N, k)) and ``raw_score`` (the scores before sigmoid/softmax: (N, 1) for two classes, (N, k) otherwise).
    The ZipMap is dropped: ``output_probability`` is a float tensor, no longer a list of {class: probability} maps.
    Rewritten: two classes as two coefficient rows with LOGISTIC (opposite rows, as skl2onnx writes them) or
    SOFTMAX, k >= 3 classes with SOFTMAX (multinomial). One-vs-rest scores, raw decision scores (NONE) and single-row
    binary classifiers (whose onnxruntime outputs are not probabilities) are refused.

    Other ``ai.onnx.ml`` featurizers (Scaler, Normalizer, OneHotEncoder...) are kept. A model op whose weights
    cannot be made trainable (TreeEnsemble*, SVM*) raises :class:`UnsupportedModelError` when
    ``weights_to_train`` is None (train every weight), and is left as it is when the caller names the weights to
    train. A graph without such ops is returned unchanged (the same object).
    """
    model = load_model(model)
    nodes = list(model.graph.node)
    regressors = _linear_ops(nodes, "LinearRegressor")
    classifiers = _linear_ops(nodes, "LinearClassifier")
    if weights_to_train is None:
        _refuse_untrainable(nodes)
    if not regressors and not classifiers:
        return model
    if len(classifiers) > 1:
        raise UnsupportedModelError(
            f"make_trainable: the graph holds {len(classifiers)} LinearClassifier nodes "
            f"({[n.name for n in classifiers]}); a trainable graph has one classifier head"
        )
    return _rewrite(model, regressors, classifiers)


def _linear_ops(nodes, op_type: str) -> list[onnx.NodeProto]:
    return [n for n in nodes if n.domain == ML_DOMAIN and n.op_type == op_type]


def holds_linear_ops(model: onnx.ModelProto) -> bool:
    """Whether ``model`` holds a LinearRegressor or LinearClassifier that :func:`make_trainable` rewrites."""
    return any(_linear_ops(model.graph.node, op) for op in ("LinearRegressor", "LinearClassifier"))


def _refuse_untrainable(nodes) -> None:
    for node in nodes:
        model_op = node.op_type.endswith(("Regressor", "Classifier")) or node.op_type == "TreeEnsemble"
        if node.domain == ML_DOMAIN and model_op and node.op_type not in ("LinearRegressor", "LinearClassifier"):
            raise UnsupportedModelError(
                f"node {node.name!r} (op {ML_DOMAIN}.{node.op_type}) keeps its weights in attributes that no gradient "
                "reaches, and it cannot be rewritten as trainable ONNX ops: train a linear model or an MLP instead "
                "(ortflow.to_onnx of LinearRegression, LogisticRegression, MLPRegressor, MLPClassifier...), or name "
                "the float initializers to train in weights_to_train to leave this node as it is"
            )


def _rewrite(model: onnx.ModelProto, regressors, classifiers) -> onnx.ModelProto:
    graph = model.graph
    # nodes are told apart by id(): this list keeps every node's Python wrapper alive, so the ids stay unique
    nodes = list(graph.node)
    ops = regressors + classifiers
    inferred = _inferred_types(model)
    names = weight_names(len(ops))
    replaced, removed, new_outputs, gone_outputs = {}, set(), [], set()
    new_inits = []
    for index, op in enumerate(ops):
        prefix = f"{op.op_type.lower()}{index}_"
        x, cast = _float_input(op, inferred, prefix)
        if op.op_type == "LinearRegressor":
            layers = [_regressor_layer(op)]
            made, inits = linear_nodes(x, layers, [names[index]], None, op.output[0], prefix)
        else:
            chain, ends = _classifier_chain(graph, nodes, op)
            classes = node_classes(op)
            layers = _classifier_layer(op, chain, classes)
            made, inits = linear_nodes(x, layers, [names[index]], None, RAW_SCORE_OUTPUT, prefix)
            head, head_inits, new_outputs = classifier_head(classes)
            made, inits = made + head, inits + head_inits
            removed.update(id(n) for n in chain)
            gone_outputs.update(ends)
        replaced[id(op)] = cast + made
        new_inits += inits
    kept = [n for n in nodes if id(n) not in removed and id(n) not in replaced]
    reused = {op.output[0] for op in regressors}  # a rewritten regressor writes the tensor it wrote before
    _check_free_names(model, kept, gone_outputs, [n for made in replaced.values() for n in made], new_inits, reused)
    new_nodes = []
    for node in nodes:
        if id(node) in replaced:
            new_nodes += replaced[id(node)]
        elif id(node) not in removed:
            new_nodes.append(node)
    outputs = [o for o in graph.output if o.name not in gone_outputs] + new_outputs
    new_graph = helper.make_graph(new_nodes, graph.name, list(graph.input), outputs,
                                  list(graph.initializer) + new_inits)
    opsets = {o.domain or "": o.version for o in model.opset_import}
    opsets.setdefault("", DEFAULT_OPSET)
    if not any(n.domain == ML_DOMAIN for n in new_nodes):
        opsets.pop(ML_DOMAIN, None)
    new = helper.make_model(new_graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
                            ir_version=model.ir_version)
    new.producer_name, new.producer_version, new.doc_string = "ortflow", "", model.doc_string
    onnx.checker.check_model(new)
    check_loadable(new)
    return new


def _attributes(node: onnx.NodeProto) -> dict:
    """The node's attributes by name, string attributes decoded."""
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode("utf-8") if isinstance(v, bytes) else v for k, v in values.items()}


def _post_transform(attrs: dict) -> str:
    return attrs.get("post_transform", "NONE")


def _regressor_layer(op: onnx.NodeProto):
    attrs = _attributes(op)
    if _post_transform(attrs) != "NONE":
        raise UnsupportedModelError(
            f"node {op.name!r} (LinearRegressor) has post_transform={_post_transform(attrs)}; only NONE is rewritten")
    targets = int(attrs.get("targets", 1))
    coef = np.asarray(attrs["coefficients"], dtype=np.float64).reshape(targets, -1).T
    intercept = np.asarray(attrs.get("intercepts", np.zeros(targets)), dtype=np.float64)
    return coef, intercept


def _classifier_layer(op: onnx.NodeProto, chain, classes: np.ndarray | None):
    """[(coef, intercept)] of the ``raw_score`` of a LinearClassifier followed by the nodes ``chain``."""
    attrs = _attributes(op)
    if classes is None:
        raise UnsupportedModelError(f"node {op.name!r} (LinearClassifier) has no class labels")
    k, transform = len(classes), _post_transform(attrs)
    intercepts = np.asarray(attrs.get("intercepts", []), dtype=np.float64)
    coefficients = np.asarray(attrs["coefficients"], dtype=np.float64)
    rows = len(intercepts) if len(intercepts) else k
    coef = coefficients.reshape(rows, -1)
    intercept = intercepts if len(intercepts) else np.zeros(rows)
    where = f"node {op.name!r} (LinearClassifier, {k} classes, {rows} coefficient rows, post_transform={transform})"
    for norm_node in (n for n in chain if n.op_type == "Normalizer"):
        norm = _attributes(norm_node).get("norm", "MAX")
        if norm != "L1":
            raise UnsupportedModelError(f"{where} is followed by Normalizer {norm_node.name!r} with norm={norm!r}; "
                                        "only L1 (which leaves probabilities unchanged) is rewritten")
    if k == 2 and rows == 1:
        raise UnsupportedModelError(
            f"{where}: with one coefficient row onnxruntime writes the scores [1 - s, s], not probabilities, so no "
            "rewrite predicts the same; convert the model with two rows (skl2onnx does) or with ortflow.to_onnx")
    if k == 2 and rows == 2 and transform == "LOGISTIC":
        if not (np.allclose(coef[0], -coef[1]) and np.allclose(intercept[0], -intercept[1])):
            raise UnsupportedModelError(f"{where}: the two rows are not opposite, so the probabilities are not a "
                                        "sigmoid of one score")
        return [(coef[1:].T, intercept[1:])]
    if k == 2 and rows == 2 and transform == "SOFTMAX":
        return [((coef[1] - coef[0])[:, None], intercept[1:] - intercept[:1])]
    if k > 2 and rows == k and transform == "SOFTMAX":
        return [(coef.T, intercept)]
    raise UnsupportedModelError(
        f"{where} cannot be rewritten: ortflow's classifiers are a sigmoid of one score (2 classes) or a softmax "
        "(multinomial); one-vs-rest or raw decision scores are not. Convert a LogisticRegression or an "
        "MLPClassifier (ortflow.to_onnx)"
    )


def _classifier_chain(graph: onnx.GraphProto, nodes, op: onnx.NodeProto):
    """The nodes between a LinearClassifier's two outputs and the graph outputs they reach, and those outputs."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in graph.output}
    chain, ends = [], []
    for tensor, steps in zip(op.output, (_LABEL_STEPS, _PROBA_STEPS)):
        while tensor:
            if tensor in graph_outputs:
                ends.append(tensor)
            users = consumers.get(tensor, [])
            if not users:
                break
            if len(users) > 1 or users[0].op_type not in steps or tensor in graph_outputs:
                names = [f"{u.name!r} ({u.op_type})" for u in users]
                raise UnsupportedModelError(
                    f"make_trainable: output {tensor!r} of LinearClassifier {op.name!r} feeds {', '.join(names)}; "
                    "only a classifier at the end of the graph (followed by Cast/Identity, Normalizer, ZipMap) is "
                    "rewritten")
            chain.append(users[0])
            tensor = users[0].output[0]
    return chain, ends


def _inferred_types(model: onnx.ModelProto) -> dict[str, int]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - inference is only used to find non-float inputs
        inferred = model
    values = list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output)
    return {v.name: v.type.tensor_type.elem_type for v in values}


def _float_input(op: onnx.NodeProto, types: dict[str, int], prefix: str):
    """The op's input, cast to float32 when it is known to be another type (the ml ops accept doubles and ints)."""
    x = op.input[0]
    if types.get(x, TensorProto.FLOAT) in (TensorProto.FLOAT, TensorProto.UNDEFINED):
        return x, []
    cast = helper.make_node("Cast", [x], [f"{prefix}input"], name=f"{prefix}cast", to=TensorProto.FLOAT)
    return cast.output[0], [cast]


def _check_free_names(model, kept_nodes, gone_outputs, made_nodes, new_inits, reused: set[str]) -> None:
    freed_graph = helper.make_graph(kept_nodes, "kept", list(model.graph.input),
                                    [o for o in model.graph.output if o.name not in gone_outputs],
                                    list(model.graph.initializer))
    taken = all_names(helper.make_model(freed_graph))
    new = {n for node in made_nodes for n in node.output} | {i.name for i in new_inits}
    clash = sorted((new & taken) - reused)
    if clash:
        raise UnsupportedModelError(f"make_trainable: the graph already uses the names {clash} that the rewritten "
                                    "linear ops need; rename them first")

