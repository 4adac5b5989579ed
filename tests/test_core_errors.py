"""Bad input gets an error that names the argument and the offending value, before any training."""

import numpy as np
import onnx
import pytest
import scipy.sparse
from sklearn.linear_model import LinearRegression

from ortflow import (
    ConvergenceError,
    DeviceError,
    OrtGradientOptimizer,
    UnsafePathError,
    add_loss_output,
    load_model,
    to_onnx,
)
from ortflow.exceptions import NotDifferentiableError
from ortflow.graph.editing import safe_join


@pytest.fixture(scope="module")
def graph(regression_data):
    X, y = regression_data
    return add_loss_output(to_onnx(LinearRegression().fit(X, y)), weight_name="weight")


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda X, y, w: (X[:, :3], y, w), "X has 3 features but the model expects 8"),
        (lambda X, y, w: (X[0], y, w), r"X has shape \(8,\); expected 2-D"),
        (lambda X, y, w: (X.astype(str), y, w), "X has dtype <U"),
        (lambda X, y, w: (X, y[:-1], w), "y has 399 rows but X has 400"),
        (lambda X, y, w: (X, y, w[:10]), "sample_weight has 10 rows but X has 400"),
        (lambda X, y, w: (np.where(np.arange(8) == 3, np.nan, X), y, w), r"X holds NaN .*index \(0, 3\)"),
        (lambda X, y, w: (X, np.full_like(y, np.inf), w), "y holds NaN or infinite"),
        (lambda X, y, w: (X[:0], y[:0], w[:0]), "X is empty"),
        (lambda X, y, w: (X, y, -w), "sample_weight has negative values"),
        (lambda X, y, w: (X, np.stack([y, y], axis=1), w), r"y has shape \(400, 2\); the model predicts 1"),
        (lambda X, y, w: (X[:, :0], y, w), r"X has 0 feature\(s\) \(shape=\(400, 0\)\)"),
        (lambda X, y, w: (X + 1j, y, w), "Complex data not supported: X has dtype complex"),
        (lambda X, y, w: (np.where(np.arange(8) == 3, "a", X.astype(object)), y, w),
         "X has dtype object holding a value that is not a number: could not convert string to float: 'a'"),
        (lambda X, y, w: (scipy.sparse.csr_matrix(X), y, w),
         "X is a sparse csr_matrix: sparse input is not supported"),
    ],
)
def test_bad_data(regression_data, graph, change, match):
    X, y = regression_data
    w = np.ones(len(X), dtype=np.float32)
    X2, y2, w2 = change(X, y, w)
    with pytest.raises((ValueError, TypeError), match=match):
        OrtGradientOptimizer(graph, max_iter=1).fit(X2, y2, sample_weight=w2)


@pytest.mark.parametrize(
    "params, error, match",
    [
        ({"batch_size": 0}, ValueError, "batch_size=0 must be a positive integer"),
        ({"max_iter": -1}, ValueError, "max_iter=-1"),
        ({"weights_to_train": ["coef", "nope"]}, ValueError, r"unknown initializers \['nope'\]"),
        ({"weights_to_train": "coef"}, TypeError, "list of names"),
        ({"learning_rate": "lbfgs"}, ValueError, "learning_rate='lbfgs' is not a learning rate"),
        ({"lr_schedule": "cosine"}, ValueError, "lr_schedule='cosine'"),
        ({"learning_rate": -1.0}, ValueError, "learning_rate=-1.0 must be a positive"),
        ({"device": "tpu"}, DeviceError, "device='tpu' is not understood"),
        ({"device": 3}, DeviceError, "device=3 must be a string"),
        ({"loss_output_name": "total"}, ValueError, "loss_output_name='total' is not an output"),
        ({"label_name": "target"}, ValueError, "label_name='target' is not an input"),
        ({"callbacks": [print]}, TypeError, "not an ortflow.trainers.callbacks.Callback"),
    ],
)
def test_bad_parameters(regression_data, graph, params, error, match):
    X, y = regression_data
    with pytest.raises(error, match=match):
        OrtGradientOptimizer(graph, **{"max_iter": 1, **params}).fit(X, y)


def test_cuda_without_cuda_build_is_a_clear_error(regression_data, graph):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has the CUDA build")
    X, y = regression_data
    with pytest.raises(DeviceError, match="no CUDA provider"):
        OrtGradientOptimizer(graph, device="cuda").fit(X, y)


def test_non_float_weight_is_refused(regression_data):
    X, y = regression_data
    onx = to_onnx(LinearRegression().fit(X, y))
    onx.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1], dtype=np.int64), "shape_"))
    with pytest.raises(ValueError, match="non-float initializers {'shape_': 'INT64'}"):
        OrtGradientOptimizer(add_loss_output(onx), weights_to_train=["coef", "shape_"]).fit(X, y)


def test_sample_weight_without_weight_input(regression_data):
    X, y = regression_data
    graph = add_loss_output(to_onnx(LinearRegression().fit(X, y)))
    with pytest.raises(ValueError, match="sample_weight was given but the graph has no weight input"):
        OrtGradientOptimizer(graph).fit(X, y, sample_weight=np.ones(len(X)))


def test_node_without_gradient_is_named():
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((2, 1), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["X", "w"], ["m"]), helper.make_node("Floor", ["m"], ["Y"], name="floor_1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(NotDifferentiableError, match="node 'floor_1' \\(op Floor\\) has no gradient"):
        OrtGradientOptimizer(add_loss_output(model)).fit(np.ones((10, 2)), np.ones(10))


def test_divergence_raises_with_epoch_and_batch(regression_data, graph):
    X, y = regression_data
    with pytest.raises(ConvergenceError, match=r"at epoch \d+, batch \d+") as info:
        OrtGradientOptimizer(graph, learning_rate=1e3, max_iter=50, shuffle=False).fit(X * 100, y)
    assert info.value.epoch >= 1 and info.value.batch >= 1


def test_divergence_without_exc_keeps_last_finite_weights(regression_data, graph):
    X, y = regression_data
    est = OrtGradientOptimizer(graph, learning_rate=1e3, max_iter=50, shuffle=False, exc=False)
    with pytest.warns(RuntimeWarning, match="weights of the last finite epoch are kept"):
        est.fit(X * 100, y)
    assert est.diverged_
    assert all(np.isfinite(v).all() for v in est.get_state().values())
    assert np.isfinite(est.predict(X)).all()
    assert all(np.isfinite(est.train_losses_))


def test_external_data_outside_the_folder_is_refused(model_with_outside_data):
    folder = model_with_outside_data
    with pytest.raises(UnsafePathError, match="'../secret.bin', outside the model's folder"):
        load_model(folder / "model.onnx")


@pytest.mark.parametrize("name", ["../escape.onnx", "/etc/passwd", "a/../../b.onnx"])
def test_file_names_cannot_escape_the_output_folder(tmp_path, name):
    with pytest.raises(UnsafePathError, match="escapes the output folder"):
        safe_join(tmp_path, name)
    assert safe_join(tmp_path, "sub/ok.onnx") == tmp_path.resolve() / "sub" / "ok.onnx"


@pytest.mark.parametrize("where", [(0, 0), (13_107, 1), (29_999, 4)])  # the first value, a block's first, the last
def test_a_non_finite_value_is_found_in_any_block_of_a_large_array(where):
    """The finite check goes by blocks of 65,536 values (no mask as large as the data): a NaN or an infinity in any
    block is found and named by its index."""
    from ortflow.runtime.validation import check_array

    X = np.ones((30_000, 5), dtype=np.float32)
    X[where] = np.inf if where[0] else np.nan
    message = rf"X holds NaN or infinite values \(first at index \({where[0]}, {where[1]}\)\)"
    with pytest.raises(ValueError, match=message):
        check_array("X", X, ndim=(2,))
    X[where] = 1.0
    assert check_array("X", X, ndim=(2,)) is X
