"""scikit-learn's estimator checks on both trainers, every expected failure listed with its reason.

The trainers take an ONNX graph, and a converted scikit-learn model fixes the number of features (its ``coef``
has one row per feature), while the checks fit on 1 to 30 features. The graph here is therefore a linear model
that takes any number of features: ``sum(X, axis=1) * coef + intercept``, one feature-width symbol, the float
weights ``coef`` and ``intercept`` that the trainers find as they find a converted model's. Full training gets it
with the squared-error loss and a weight input (so the sample-weight checks apply); forward-backward training takes
the prediction graph and adds its loss itself. The learning rate is small because a few checks fit on features
around 100 (their squared error would diverge at the default rate).

Besides the expected failures below, scikit-learn itself skips ``check_array_api_input`` unless the environment
sets ``SCIPY_ARRAY_API=1`` (the trainers take numpy arrays only; onnxruntime reads numpy buffers).
"""

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh
from sklearn.utils.estimator_checks import parametrize_with_checks

from ortflow import OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer, add_loss_output


def any_width_linear_graph():
    nodes = [
        oh.make_node("ReduceSum", ["X", "axes"], ["row_sum"], keepdims=1),
        oh.make_node("Mul", ["row_sum", "coef"], ["scaled"]),
        oh.make_node("Add", ["scaled", "intercept"], ["variable"]),
    ]
    weights = [
        nh.from_array(np.array([1], np.int64), "axes"),
        nh.from_array(np.array([0.1], np.float32), "coef"),
        nh.from_array(np.array([0.0], np.float32), "intercept"),
    ]
    graph = oh.make_graph(nodes, "any_width_linear", [oh.make_tensor_value_info("X", TensorProto.FLOAT, ["N", "F"])],
                          [oh.make_tensor_value_info("variable", TensorProto.FLOAT, ["N", 1])], weights)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


SETTINGS = dict(max_iter=5, learning_rate=1e-5)
ESTIMATORS = [
    OrtGradientOptimizer(add_loss_output(any_width_linear_graph(), weight_name="weight"), **SETTINGS),
    OrtGradientForwardBackwardOptimizer(any_width_linear_graph(), **SETTINGS),
]

#: The checks that fail by design, the same for both trainers, each with the reason.
EXPECTED_FAILED_CHECKS = {
    "check_n_features_in_after_fitting": (
        "predict refuses X with another number of features than fit saw (n_features_in_ is set), but its message "
        "'X has 1 features but the model expects 4' names the model, not the estimator class the check's regular "
        "expression wants ('... but <Estimator> is expecting 4 features as input')"
    ),
    "check_sample_weight_equivalence_on_dense_data": (
        "minibatch SGD for a few epochs: a weighted row and the same row repeated fall into different batches, so "
        "the updates differ; only the converged optimum would be the same"
    ),
    "check_dict_unchanged": (
        "predict builds its inference session on the first call and keeps it (a fit used only to export a graph "
        "builds none); the session is a cache, not fitted state"
    ),
}


@pytest.mark.filterwarnings("ignore")
@parametrize_with_checks(ESTIMATORS, expected_failed_checks=lambda est: EXPECTED_FAILED_CHECKS)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)
