"""scikit-learn models to trainable ONNX graphs.

Linear models and MLPs are written directly as MatMul/Add/activation graphs, so every weight is a named float
initializer and every node has a gradient. A single-layer model (a linear model) names its weights ``coef`` and
``intercept``, as onnxcustom's documents use them; a multi-layer model (an MLP) names layer ``i``'s
``coef_<i>`` and ``intercept_<i>``. Binary classifiers expose their raw
score (``raw_score``, shape (N, 1)) next to ``output_label`` and ``output_probability``: training uses the raw score,
the exported model keeps predicting labels and probabilities. Other models go through skl2onnx.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ._ort import MAX_OPSET
from .graph import check_loadable

INPUT_NAME = "X"
REGRESSION_OUTPUT = "variable"
LABEL_OUTPUT = "output_label"
PROBA_OUTPUT = "output_probability"
RAW_SCORE_OUTPUT = "raw_score"
IR_VERSION = 8  # any IR <= 10 works; 8 matches opset 15-17 era tools and stays readable by older runtimes.

_ACTIVATIONS = {"relu": "Relu", "tanh": "Tanh", "logistic": "Sigmoid", "identity": None}


def to_onnx(model: Any, X: np.ndarray | None = None, target_opset: int = 17) -> onnx.ModelProto:
    """Convert a fitted scikit-learn model into an ONNX graph ortflow can train.

    ``X`` (a sample of the inputs) is only needed by the skl2onnx fallback. Supported directly:
    LinearRegression, Ridge, Lasso, ElasticNet, SGDRegressor, LogisticRegression (binary), MLPRegressor,
    MLPClassifier (binary).
    """
    from sklearn.base import is_classifier, is_regressor
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    if target_opset > MAX_OPSET:
        raise ValueError(f"target_opset={target_opset}: onnxruntime-training 1.19.2 supports at most {MAX_OPSET}")
    if isinstance(model, MLPRegressor):
        return _mlp(model, classifier=False, opset=target_opset)
    if isinstance(model, MLPClassifier):
        return _mlp(model, classifier=True, opset=target_opset)
    linear = hasattr(model, "coef_") and hasattr(model, "intercept_")
    if linear and is_classifier(model):
        layers = [(np.asarray(model.coef_).T, np.atleast_1d(model.intercept_))]
        return _build(layers, None, "identity", n_outputs=1, classes=model.classes_, opset=target_opset)
    if linear and is_regressor(model):
        coef = np.asarray(model.coef_)
        coef = coef.reshape(-1, 1) if coef.ndim == 1 else coef.T
        intercept = np.broadcast_to(np.asarray(model.intercept_, dtype=np.float64), (coef.shape[1],))
        return _build([(coef, intercept)], None, "identity", n_outputs=coef.shape[1], classes=None, opset=target_opset)
    return _skl2onnx(model, X, target_opset)


def weight_names(n_layers: int) -> list[tuple[str, str]]:
    """Names of the (coefficient, intercept) initializers of each layer: ``coef``/``intercept`` for one layer,
    ``coef_<i>``/``intercept_<i>`` for several."""
    if n_layers == 1:
        return [("coef", "intercept")]
    return [(f"coef_{i}", f"intercept_{i}") for i in range(n_layers)]


def _mlp(model: Any, classifier: bool, opset: int) -> onnx.ModelProto:
    layers = list(zip(model.coefs_, model.intercepts_))
    classes = model.classes_ if classifier else None
    if not classifier and model.out_activation_ != "identity":
        raise ValueError(f"MLPRegressor with out_activation_={model.out_activation_!r} is not supported")
    return _build(layers, model.activation, "identity", n_outputs=layers[-1][0].shape[1], classes=classes, opset=opset)


def _build(layers, hidden_activation, out_activation, n_outputs, classes, opset) -> onnx.ModelProto:
    if classes is not None and len(classes) != 2:
        raise ValueError(
            f"only binary classifiers are supported (the model has {len(classes)} classes): ortflow's log loss "
            "is binary"
        )
    n_features = layers[0][0].shape[0]
    nodes, inits = [], []
    current = INPUT_NAME
    for i, ((coef, intercept), (coef_name, intercept_name)) in enumerate(zip(layers, weight_names(len(layers)))):
        last = i == len(layers) - 1
        inits.append(numpy_helper.from_array(np.asarray(coef, dtype=np.float32), coef_name))
        inits.append(numpy_helper.from_array(np.asarray(intercept, dtype=np.float32).reshape(-1), intercept_name))
        nodes.append(helper.make_node("MatMul", [current, coef_name], [f"matmul_{i}"]))
        out = (RAW_SCORE_OUTPUT if classes is not None else REGRESSION_OUTPUT) if last else f"linear_{i}"
        activation = _ACTIVATIONS[out_activation if last else hidden_activation]
        if activation is None:
            nodes.append(helper.make_node("Add", [f"matmul_{i}", intercept_name], [out]))
        else:
            nodes.append(helper.make_node("Add", [f"matmul_{i}", intercept_name], [f"pre_{i}"]))
            nodes.append(helper.make_node(activation, [f"pre_{i}"], [out]))
        current = out
    inputs = [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [None, n_features])]
    if classes is None:
        outputs = [helper.make_tensor_value_info(REGRESSION_OUTPUT, TensorProto.FLOAT, [None, n_outputs])]
    else:
        outputs = _binary_head(nodes, inits, np.asarray(classes))
    graph = helper.make_graph(nodes, "ortflow_model", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)
    model.producer_name = "ortflow"
    onnx.checker.check_model(model)
    return model


def _binary_head(nodes, inits, classes: np.ndarray):
    """Nodes mapping ``raw_score`` (N, 1) to labels and [1-p, p] probabilities."""
    label_type = TensorProto.INT64 if classes.dtype.kind in "iub" else TensorProto.STRING
    if label_type == TensorProto.STRING:
        classes = classes.astype(str).astype(object)
    else:
        classes = classes.astype(np.int64)
    nodes += [
        helper.make_node("Constant", [], ["one_"], value=numpy_helper.from_array(np.array([1.0], dtype=np.float32))),
        helper.make_node("Constant", [], ["classes_"], value=helper.make_tensor("classes", label_type, [2], list(classes))),
        helper.make_node("Sigmoid", [RAW_SCORE_OUTPUT], ["proba1_"]),
        helper.make_node("Sub", ["one_", "proba1_"], ["proba0_"]),
        helper.make_node("Concat", ["proba0_", "proba1_"], [PROBA_OUTPUT], axis=1),
        helper.make_node("ArgMax", [PROBA_OUTPUT], ["label_index_"], axis=1, keepdims=0),
        helper.make_node("Gather", ["classes_", "label_index_"], [LABEL_OUTPUT], axis=0),
    ]
    return [
        helper.make_tensor_value_info(LABEL_OUTPUT, label_type, [None]),
        helper.make_tensor_value_info(PROBA_OUTPUT, TensorProto.FLOAT, [None, 2]),
        helper.make_tensor_value_info(RAW_SCORE_OUTPUT, TensorProto.FLOAT, [None, 1]),
    ]


def _skl2onnx(model: Any, X: np.ndarray | None, target_opset: int) -> onnx.ModelProto:
    from skl2onnx import to_onnx as skl_to_onnx

    if X is None:
        raise ValueError(f"to_onnx: {type(model).__name__} goes through skl2onnx, which needs a sample X")
    onx = skl_to_onnx(
        model,
        np.asarray(X[:1], dtype=np.float32),
        target_opset={"": target_opset, "ai.onnx.ml": 3},
        black_op={"LinearRegressor", "LinearClassifier"},
    )
    if onx.ir_version > 10:
        onx.ir_version = 10
    check_loadable(onx)
    return onx
