"""The GPU (issue 39): the CUDA provider's options (precision), the device errors, and, on a machine with a GPU
(``pytest -m gpu``), every trainer on CUDA in exact float32 against its CPU run.

The CPU tests check what ortflow asks of onnxruntime; the ``gpu`` tests (skipped without a CUDA provider that loads,
see conftest) check what the GPU computes. The trainers' tolerance is derived, and checked on CPU against float64:
one full-batch SGD step of a linear regression, whose only sums are ``X @ w`` and ``X.T @ r``.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from sklearn.linear_model import LinearRegression

import ortflow
from ortflow import DeviceError, OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer, add_loss_output, to_onnx
from ortflow.runtime.placement import Placement
from ortflow.runtime.sessions import cuda_provider_options
from tolerances import U32, assert_close, float32_sum_atol, matmul_atol

LR = 0.05


@pytest.fixture(scope="module")
def linear():
    """(X, y, the graph of a poorly fitted linear regression, its start w0 and b0): 64 rows, 6 features."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 6)).astype(np.float32)
    y = (X @ rng.standard_normal(6) + 0.5 + 0.1 * rng.standard_normal(64)).astype(np.float32)
    start = LinearRegression().fit(X[:8] * 3, y[:8])
    return X, y, to_onnx(start), start.coef_.astype(np.float32), np.float32(start.intercept_)


def _one_step(cls, graph, X, y, device: str, precision: str = "fp32") -> np.ndarray:
    """The coefficients after one SGD step over the whole data (one batch, no shuffling)."""
    model = add_loss_output(graph) if cls is OrtGradientOptimizer else graph
    est = cls(model, max_iter=1, batch_size=len(X), learning_rate=LR, shuffle=False, device=device,
              precision=precision).fit(X, y)
    return np.concatenate([np.ravel(v) for k, v in sorted(est.get_state().items()) if k in ("coef", "intercept")])


def _step_reference(X, y, w0, b0):
    """(the step in float64: coef then intercept, its float32 tolerance). The squared error's gradient over n rows
    is ``2/n X.T r`` with ``r = X w + b - y``: ``r`` carries the rounding of a sum of d + 2 terms, the gradient a
    sum of n terms of ``|X| |r|`` plus the propagated ``|X| err_r``, and the update one more rounding of ``w``."""
    X64, y64 = X.astype(np.float64), y.astype(np.float64)
    r = X64 @ w0 + b0 - y64
    n = len(X)
    grad = 2 / n * np.concatenate([X64.T @ r, [r.sum()]])
    step = np.concatenate([w0, [b0]]) - LR * grad
    err_r = float32_sum_atol(np.abs(X64) @ np.abs(w0) + abs(b0) + np.abs(y64), X.shape[1] + 2)
    ones = np.ones((n, 1))
    A = np.hstack([np.abs(X64), ones])
    err_grad = 2 / n * (float32_sum_atol(A.T @ np.abs(r), n) + A.T @ err_r)
    return step, LR * err_grad + 4 * U32 * np.abs(step)


# --- CPU: what ortflow asks of onnxruntime ------------------------------------------------------------------------
def test_cuda_provider_options_carry_the_precision():
    """Seen on an H100: onnxruntime's CUDA provider multiplies float32 in TF32 unless told not to (``use_tf32``),
    so a CUDA fit differed from the CPU's by 3e-3 relative. fp32 (the default) asks for exact products."""
    assert cuda_provider_options("cuda") == {"device_id": "0", "use_tf32": "0"}
    assert cuda_provider_options("cuda:1", "tf32") == {"device_id": "1", "use_tf32": "1"}
    assert Placement("cuda:1", "tf32").providers() == [
        ("CUDAExecutionProvider", {"device_id": "1", "use_tf32": "1"}), "CPUExecutionProvider"]
    assert Placement.of("cpu").providers() == ["CPUExecutionProvider"] and Placement.of("cpu").precision == "fp32"


@pytest.mark.parametrize("cls", [OrtGradientOptimizer, OrtGradientForwardBackwardOptimizer])
def test_trainer_sessions_carry_its_precision(cls, linear):
    """Issue 44 item 6: the precision is part of the trainer's Placement (what every session gets), no longer a
    SessionOptions entry read back."""
    X, y, graph = linear[:3]
    assert cls(graph).precision == "fp32"
    for precision in ("fp32", "tf32"):
        assert cls(graph, precision=precision)._placement() == Placement("cpu", precision)
    model = add_loss_output(graph) if cls is OrtGradientOptimizer else graph
    est = cls(model, max_iter=1, precision="tf32").fit(X, y)
    assert est._rt_placement == Placement("cpu", "tf32") and est._rt_runtime.placement is est._rt_placement


@pytest.mark.parametrize("cls", [OrtGradientOptimizer, OrtGradientForwardBackwardOptimizer])
def test_invalid_precision_is_refused_naming_the_choices(cls, linear):
    X, y, graph = linear[:3]
    model = add_loss_output(graph) if cls is OrtGradientOptimizer else graph
    with pytest.raises(ValueError, match=r"precision='fp16' is not one of \['fp32', 'tf32'\]"):
        cls(model, max_iter=1, precision="fp16").fit(X, y)
    with pytest.raises(ValueError, match="precision='bf16'"):
        Placement.of("cpu", "bf16")


def test_cuda_without_the_provider_names_what_to_install(linear):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    X, y, graph = linear[:3]
    with pytest.raises(DeviceError, match=r"device='cuda' but this onnxruntime build has no CUDA provider .*"
                                          r"pip install 'ortflow\[gpu\]'"):
        OrtGradientOptimizer(add_loss_output(graph), max_iter=1, device="cuda").fit(X, y)


def test_device_info_names_the_build():
    info = ortflow.device_info()
    assert info["version"] == ort.__version__ and info["backend"] == ortflow.backend()
    assert info["providers"] == ort.get_available_providers()
    if "CUDAExecutionProvider" not in info["providers"]:
        assert info["cuda_version"] is None and info["cudnn_version"] is None and info["gpu"] is None
    else:  # the CUDA and cuDNN the provider looks for, from the build's own record
        assert info["cuda_version"] and info["cudnn_version"] in ("8", "9")


def test_torch_layer_follows_torch_precision():
    torch = pytest.importorskip("torch")
    from ortflow.torch import OnnxModule, torch_precision

    rng = np.random.default_rng(0)
    X = rng.standard_normal((16, 3)).astype(np.float32)
    graph = to_onnx(LinearRegression().fit(X, X @ [1.0, 2.0, 3.0]))
    saved = torch.get_float32_matmul_precision()
    try:
        for setting, expected in (("highest", "fp32"), ("high", "tf32"), ("medium", "tf32")):
            torch.set_float32_matmul_precision(setting)
            assert torch_precision() == expected
            layer = OnnxModule(graph)
            layer(torch.tensor(X))  # builds the runtime of the device, reading torch's setting
            runtime = next(iter(layer._runtimes.values()))
            assert runtime.placement.precision == expected, setting
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.allow_tf32 = True  # the older switch says the same
        assert torch_precision() == "tf32"
    finally:
        torch.set_float32_matmul_precision(saved)


@pytest.mark.parametrize("cls", [OrtGradientOptimizer, OrtGradientForwardBackwardOptimizer])
def test_step_tolerance_holds_on_cpu(cls, linear):
    """The tolerance the GPU test uses, checked where it can be: the CPU's float32 step against float64."""
    X, y, graph, w0, b0 = linear
    expected, atol = _step_reference(X, y, w0, b0)
    assert_close(_one_step(cls, graph, X, y, "cpu"), expected, rtol=0, atol=atol, err_msg=cls.__name__)


# --- GPU --------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("cls", [OrtGradientOptimizer, OrtGradientForwardBackwardOptimizer])
def test_cuda_fp32_step_matches_cpu(cls, linear):
    """Every trainer on CUDA in fp32 within the derived tolerance of its CPU run (each within it of float64)."""
    X, y, graph, w0, b0 = linear
    expected, atol = _step_reference(X, y, w0, b0)
    cpu, gpu = (_one_step(cls, graph, X, y, device) for device in ("cpu", "cuda"))
    assert_close(gpu, expected, rtol=0, atol=atol, err_msg=f"{cls.__name__} on cuda against float64")
    assert_close(gpu, cpu, rtol=0, atol=2 * atol, err_msg=f"{cls.__name__} cuda against cpu")


@pytest.mark.gpu
def test_cuda_precision_reaches_the_products():
    """An MLP's forward on CUDA: within float32's bound of float64 in fp32; in tf32 (10-bit mantissas) beyond it,
    which shows that the setting reaches onnxruntime (the fault seen: TF32 where fp32 was meant)."""
    from ortflow.runtime.sessions import OnnxFunction
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 512)).astype(np.float32)
    w = rng.standard_normal((512, 256)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [None, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 256])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    exact, atol = a.astype(np.float64) @ w, matmul_atol(a, w)
    fp32 = OnnxFunction(model, Placement.of("cuda", "fp32")).run(a)[0].numpy()
    assert_close(fp32, exact, rtol=0, atol=atol, err_msg="fp32 on cuda")
    tf32 = OnnxFunction(model, Placement.of("cuda", "tf32")).run(a)[0].numpy()
    assert np.any(np.abs(tf32 - exact) > atol), "tf32 asked for, yet the products are exact float32"


@pytest.mark.gpu
def test_device_rows_on_cuda_are_the_copied_rows():
    """ortflow.runtime.device_data on the GPU: rows shuffled and bound by address on the device, the loss written into a
    device vector, equal to the same rows fed from the host (the same session: the same kernels)."""
    from onnx import TensorProto, helper

    from ortflow._ort import _C
    from ortflow.runtime.device_data import DeviceLosses, DeviceRows
    from ortflow.runtime.sessions import OnnxFunction

    nodes = [helper.make_node("ReduceSumSquare", ["X"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])])
    fn = OnnxFunction(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), "cuda")
    X = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    permutation = np.random.default_rng(1).permutation(50)
    rows, losses = DeviceRows([X], "cuda"), DeviceLosses(5, "cuda")
    rows.shuffle(permutation)
    binding = _C.SessionIOBinding(fn._sess)
    for i in range(5):
        rows.bind(binding, ["X"], slice(10 * i, 10 * i + 10))
        losses.bind(binding, "loss", i)
        fn.run_bound(binding)
    expected = [float(fn.run(X[permutation][10 * i: 10 * i + 10])[0].numpy()) for i in range(5)]
    np.testing.assert_array_equal(losses.read(5), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("shuffle", [False, True])
def test_cuda_device_loop_trains_as_the_host_loop(linear, shuffle):
    """Full training on CUDA keeps the data on the GPU by default (copied once, batches bound by address, losses
    read at each epoch's end): the same sessions on the same rows as the host loop (``_device_data=False``), so the
    same weights and losses, the last partial batch (64 rows in 24s) and the shuffled epochs included; a diverging
    fit is named as the host loop names it and keeps its weights."""
    from ortflow import ConvergenceError

    X, y, graph, _, _ = linear
    model = add_loss_output(graph)
    fitted = []
    for on_device in (False, None):
        est = OrtGradientOptimizer(model, max_iter=3, batch_size=24, learning_rate="adam", shuffle=shuffle,
                                   random_state=0, device="cuda")
        est._device_data = on_device
        fitted.append(est.fit(X, y))
    host, device = fitted
    assert host._rt_batches and not device._rt_batches  # which loop ran: the host loop's batch buffers
    assert device.train_losses_ == host.train_losses_
    for name, value in host.get_state().items():
        np.testing.assert_array_equal(device.get_state()[name], value, err_msg=name)
    errors, states = [], []
    for on_device in (False, None):
        est = OrtGradientOptimizer(model, learning_rate=1e3, max_iter=50, shuffle=False, device="cuda")
        est._device_data = on_device
        with pytest.raises(ConvergenceError, match=r"at epoch \d+, batch \d+") as info:
            est.fit(X * 100, y)
        errors.append(str(info.value))
        states.append(est.get_state())
    assert errors[1] == errors[0]
    for name, value in states[0].items():
        np.testing.assert_array_equal(states[1][name], value, err_msg=name)
