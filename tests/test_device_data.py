"""Training data on the device (ortflow.runtime.device_data, issue 39 item 3), on the CPU: batches bound by address and
rows shuffled on the device give exactly what copying the rows gives; losses land in a device vector."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortflow._ort import _C
from ortflow.runtime.device_data import DEVICE_DATA_LIMIT, DeviceLosses, DeviceRows, fits_on_device
from ortflow.runtime.sessions import OnnxFunction


@pytest.fixture(scope="module")
def loss_function():
    """loss = mean((X @ w - y)^2), X (N, 3), y (N, 1)."""
    w = numpy_helper.from_array(np.array([[0.5], [-1.0], [2.0]], np.float32), "w")
    nodes = [helper.make_node("MatMul", ["X", "w"], ["p"]), helper.make_node("Sub", ["p", "y"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["s"]), helper.make_node("ReduceMean", ["s"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "loss", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3]),
                                              helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], [w])
    return OnnxFunction(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), "cpu")


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((23, 3)).astype(np.float32), rng.standard_normal((23, 1)).astype(np.float32)


def _copied_loss(fn, X, y):
    return float(fn.run(X, y)[0].numpy())


def test_batches_bound_by_address_are_the_copied_rows(loss_function, data):
    X, y = data
    rows = DeviceRows([X, y.astype(np.float64)], "cpu")  # float64 becomes float32, as the trainers feed it
    assert rows.nbytes == X.nbytes + y.nbytes and rows.n_rows == 23
    binding = _C.SessionIOBinding(loss_function._sess)
    binding.bind_output("loss", loss_function._device)
    losses = DeviceLosses(3)
    for i, start in enumerate(range(0, 23, 10)):  # 10, 10 and the last 3 rows
        n = rows.bind(binding, ["X", "y"], slice(start, start + 10))
        losses.bind(binding, "loss", i)
        loss_function.run_bound(binding)
        assert n == min(10, 23 - start)
        assert losses.read(i + 1)[i] == _copied_loss(loss_function, X[start: start + 10], y[start: start + 10])
    with pytest.raises(ValueError, match="consecutive rows"):
        rows.bind(binding, ["X", "y"], slice(0, 10, 2))
    with pytest.raises(IndexError, match="outside the 3"):
        losses.bind(binding, "loss", 3)


def test_rows_shuffled_on_the_device_are_the_permuted_rows(loss_function, data):
    X, y = data
    rows = DeviceRows([X, y], "cpu")
    permutation = np.random.default_rng(1).permutation(23)
    rows.shuffle(permutation)
    np.testing.assert_array_equal(rows.read()[0], X[permutation])
    binding = _C.SessionIOBinding(loss_function._sess)
    binding.bind_output("loss", loss_function._device)
    rows.bind(binding, ["X", "y"], slice(5, 15))
    loss_function.run_bound(binding)
    got = float(binding.get_outputs()[0].numpy())
    assert got == _copied_loss(loss_function, X[permutation][5:15], y[permutation][5:15])
    rows.unshuffle()
    np.testing.assert_array_equal(rows.read()[1], y)
    with pytest.raises(ValueError, match="permutation of 23 rows"):
        rows.shuffle(np.arange(5))


def test_data_goes_to_the_device_when_it_fits_twice_in_half_the_free_memory():
    assert fits_on_device(10**12, "cpu")  # in memory already
    assert fits_on_device(250, "cuda", free=1000) and not fits_on_device(251, "cuda", free=1000)
    assert fits_on_device(500, "cuda", shuffled=False, free=1000)
    from ortflow.runtime.device_data import free_device_memory

    if free_device_memory("cuda") is None:  # no nvidia-ml-py or no GPU: unknown free memory, a size limit
        assert fits_on_device(DEVICE_DATA_LIMIT // 2, "cuda") and not fits_on_device(DEVICE_DATA_LIMIT // 2 + 1, "cuda")
        assert fits_on_device(DEVICE_DATA_LIMIT, "cuda", shuffled=False)


# --- full training's loop over device rows (OrtGradientOptimizer, StepGraphRuntime.train_device_rows) ---------------
def _fitted(graph, X, y, on_device: bool, **params):
    from ortflow import OrtGradientOptimizer

    est = OrtGradientOptimizer(graph, **params)
    est._device_data = on_device  # the CPU as the device: the loop CUDA runs by default
    return est


@pytest.fixture(scope="module")
def regression_graph(regression_data):
    from sklearn.linear_model import LinearRegression

    from ortflow import add_loss_output, to_onnx

    X, y = regression_data
    return add_loss_output(to_onnx(LinearRegression().fit(X[:10] * 3, y[:10])))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("rate", [0.01, "adam"])
def test_device_loop_trains_as_the_host_loop(regression_data, regression_graph, shuffle, rate):
    """400 rows in batches of 48 (the last one 16 rows), 3 epochs: the same step sessions on the same rows in the
    same order, so weights, optimizer state (Adam's step numbers come from a device vector) and every epoch's loss
    are bit-identical; the data is on the device only during the fit."""
    X, y = regression_data
    params = dict(max_iter=3, batch_size=48, shuffle=shuffle, learning_rate=rate, random_state=0)
    host = _fitted(regression_graph, X, y, False, **params).fit(X, y)
    device = _fitted(regression_graph, X, y, True, **params).fit(X, y)
    assert host._rt_batches and not device._rt_batches  # which loop ran: the host loop's batch buffers
    assert device.train_losses_ == host.train_losses_
    assert device.train_losses_[-1] < device.train_losses_[0]
    for name, value in host.get_state().items():
        np.testing.assert_array_equal(device.get_state()[name], value, err_msg=name)
    for name, value in host.get_optimizer_state().items():
        np.testing.assert_array_equal(device.get_optimizer_state()[name], value, err_msg=name)
    assert device._rt_device_rows is None and device._rt_runtime._on_device is None  # freed when the fit ends
    device.partial_fit(X[:100], y[:100])  # a new call's rows, copied for it
    host.partial_fit(X[:100], y[:100])
    np.testing.assert_array_equal(device.get_state()["coef"], host.get_state()["coef"])


@pytest.mark.parametrize("exc", [True, False])
def test_device_loop_names_the_divergence_and_keeps_the_host_loops_weights(regression_data, regression_graph, exc):
    """The losses are read at the epoch's end, after every step ran: the first non-finite one is named as the host
    loop names it (epoch and batch), and the state is rolled back and replayed to the one before it (exc=True), or
    the last finite epoch's weights are restored (exc=False): the host loop's weights in both cases."""
    from ortflow import ConvergenceError

    X, y = regression_data
    messages, states = [], []
    for on_device in (False, True):
        est = _fitted(regression_graph, X, y, on_device, learning_rate=1e3, max_iter=50, shuffle=False, exc=exc)
        if exc:
            with pytest.raises(ConvergenceError, match=r"at epoch \d+, batch \d+") as info:
                est.fit(X * 100, y)
            messages.append(str(info.value))
        else:
            with pytest.warns(RuntimeWarning, match="weights of the last finite epoch are kept") as record:
                est.fit(X * 100, y)
            messages.append(str(record[0].message))
        assert est.diverged_ and bool(est._rt_batches) is not on_device
        states.append((est.get_state(), est._rt_runtime.steps))
    assert messages[1] == messages[0]
    (host, host_steps), (device, device_steps) = states
    assert device_steps == host_steps
    for name, value in host.items():
        assert np.isfinite(value).all(), name
        np.testing.assert_array_equal(device[name], value, err_msg=name)
