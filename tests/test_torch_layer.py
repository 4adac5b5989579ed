"""ortflow.torch.OnnxModule: an ONNX graph inside a torch model, checked against the same model written in torch."""

import pickle
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")

from sklearn.neural_network import MLPRegressor  # noqa: E402

from ortflow import to_onnx  # noqa: E402
from ortflow._ort import InferenceSession  # noqa: E402
from ortflow.torch import OnnxModule, parameter_name  # noqa: E402


def fitted_mlp(n_features=8, hidden=(6, 4), n_outputs=1, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((60, n_features)).astype(np.float32)
    y = X[:, :n_outputs] * 2 + 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MLPRegressor(hidden_layer_sizes=hidden, max_iter=3, random_state=seed).fit(
            X, y.ravel() if n_outputs == 1 else y)


def torch_mlp(mlp, dtype=torch.float32):
    """nn.Sequential with the weights of the scikit-learn MLP."""
    layers = []
    for i, (coef, intercept) in enumerate(zip(mlp.coefs_, mlp.intercepts_)):
        lin = torch.nn.Linear(*coef.shape, dtype=dtype)
        with torch.no_grad():
            lin.weight.copy_(torch.tensor(coef.T))
            lin.bias.copy_(torch.tensor(intercept))
        layers += [lin, torch.nn.ReLU()] if i < len(mlp.coefs_) - 1 else [lin]
    return torch.nn.Sequential(*layers)


def as_double(model: onnx.ModelProto) -> onnx.ModelProto:
    """The float32 graph with every float tensor in float64."""
    new = onnx.ModelProto()
    new.CopyFrom(model)
    for init in new.graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float64), init.name))
    for value in list(new.graph.input) + list(new.graph.output) + list(new.graph.value_info):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    return new


def torch_grads(module):
    """Gradients of the torch MLP's Linear layers as (coef, intercept) in the ONNX layout."""
    linears = [m for m in module if isinstance(m, torch.nn.Linear)]
    return [(lin.weight.grad.T, lin.bias.grad) for lin in linears]


def onnx_grads(module):
    params = module.parameters_by_initializer()
    return [(params[f"coef_{i}"].grad, params[f"intercept_{i}"].grad) for i in range(len(params) // 2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_outputs_and_gradients_equal_torch(regression_data, dtype):
    mlp = fitted_mlp()
    onx = to_onnx(mlp)
    layer = OnnxModule(onx if dtype == torch.float32 else as_double(onx))
    ref = torch_mlp(mlp, dtype)
    assert [n for n, _ in layer.named_parameters()] == ["coef_0", "intercept_0", "coef_1", "intercept_1",
                                                        "coef_2", "intercept_2"]
    X = torch.tensor(regression_data[0][:32], dtype=dtype)
    x1, x2 = X.clone().requires_grad_(), X.clone().requires_grad_()
    out, expected = layer(x1), ref(x2)
    assert out.dtype == dtype and out.shape == (32, 1)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    ((out - 1) ** 2).mean().backward()
    ((expected - 1) ** 2).mean().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-7)
    for (gw, gb), (ew, eb) in zip(onnx_grads(layer), torch_grads(ref)):
        torch.testing.assert_close(gw, ew, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(gb, eb, rtol=1e-5, atol=1e-7)


def test_gradcheck_float64_graph():
    layer = OnnxModule(as_double(to_onnx(fitted_mlp(n_features=4, hidden=(5,)))))
    names = [n for n, _ in layer.named_parameters()]
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    params = [p.detach().clone().requires_grad_() for p in layer.parameters()]

    def call(x, *ps):
        return torch.func.functional_call(layer, dict(zip(names, ps)), (x,))

    assert torch.autograd.gradcheck(call, (x, *params))


def test_outputs_survive_backward_and_a_second_backward_recomputes():
    """Seen: onnxruntime's backward pass wrote into the forward outputs' buffers, so the outputs changed after
    ``backward()`` and a second backward (retain_graph) got gradients from the changed values."""
    layer = OnnxModule(to_onnx(fitted_mlp(n_features=4, hidden=(5,))))
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    out = layer(x)
    before = out.detach().clone()
    loss = out.square().sum()
    loss.backward(retain_graph=True)
    torch.testing.assert_close(out.detach(), before, rtol=0, atol=0)
    first = [p.grad.clone() for p in layer.parameters()]
    loss.backward(retain_graph=True)  # onnxruntime's state served the first pass: the forward pass runs again
    for p, g in zip(layer.parameters(), first):
        torch.testing.assert_close(p.grad, 2 * g)
    with torch.no_grad():
        next(layer.parameters()).add_(1.0)
    with pytest.raises(RuntimeError, match=r"tensors \[1\] \(inputs, then parameters\) were modified in place"):
        loss.backward()


def test_mixed_model_trains_like_torch(regression_data):
    """torch Linear -> ONNX MLP -> torch Linear, Adam, against the same model all in torch."""
    X = torch.tensor(regression_data[0])
    y = torch.tensor(regression_data[1]).reshape(-1, 1)
    mlp = fitted_mlp(n_features=6, hidden=(10,), n_outputs=3)

    def build(middle):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 6), middle, torch.nn.Linear(3, 1))

    mixed, pure = build(OnnxModule(to_onnx(mlp))), build(torch_mlp(mlp))
    losses = {}
    for name, model in (("mixed", mixed), ("pure", pure)):
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(60):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(X), y)
            loss.backward()
            opt.step()
        losses[name] = loss.item()
    first = torch.nn.functional.mse_loss(build(torch_mlp(mlp))(X), y).item()
    assert losses["pure"] < 0.5 * first  # it learned something
    assert losses["mixed"] == pytest.approx(losses["pure"], rel=0.01)
    # the ONNX layer's weights moved, and get_trained_onnx carries them to a plain InferenceSession
    layer = mixed[1]
    assert not np.allclose(layer.coef_0.detach().numpy(), mlp.coefs_[0])
    hidden = mixed[0](X).detach()
    sess = InferenceSession(layer.get_trained_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"X": hidden.numpy()})[0], layer(hidden).detach().numpy(), rtol=1e-6)


def test_state_dict_pickle_and_torch_save(tmp_path, regression_data):
    X = torch.tensor(regression_data[0][:20])
    layer = OnnxModule(to_onnx(fitted_mlp()))
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1)
    expected = layer(X).detach()
    fresh = OnnxModule(to_onnx(fitted_mlp()))
    assert not torch.equal(fresh(X).detach(), expected)
    fresh.load_state_dict(layer.state_dict())
    assert torch.equal(fresh(X).detach(), expected)
    assert torch.equal(pickle.loads(pickle.dumps(layer))(X).detach(), expected)
    torch.save(layer, tmp_path / "layer.pt")
    assert torch.equal(torch.load(tmp_path / "layer.pt", weights_only=False)(X).detach(), expected)


def test_train_eval_no_grad_and_changing_batch_size(regression_data):
    mlp = fitted_mlp()
    layer, ref = OnnxModule(to_onnx(mlp), static_shapes=2), torch_mlp(mlp)
    X = torch.tensor(regression_data[0])
    for rows in (15, 7, 15, 3, 1, 40):  # 3 shapes beyond the 2 static graphs: the any-shape graph
        layer.zero_grad()
        ref.zero_grad()
        x = X[:rows]
        out = layer(x)
        assert out.shape == (rows, 1)
        out.sum().backward()  # an expanded (stride 0) gradient
        ref(x).sum().backward()
        torch.testing.assert_close(layer.coef_0.grad, ref[0].weight.grad.T, rtol=1e-5, atol=1e-6)
    layer.eval()
    with torch.no_grad():
        evaluated = layer(X)
    layer.train()
    torch.testing.assert_close(evaluated, layer(X).detach(), rtol=0, atol=0)
    torch.testing.assert_close(evaluated, ref(X).detach(), rtol=1e-5, atol=1e-6)


def static_session_threads(layer, rows):
    """Intra-op threads of the session behind the layer's shape-specialized graph for a batch of ``rows``."""
    out = layer(torch.zeros(rows, 8))
    out.sum().backward()
    fb = next(iter(layer._runtimes.values()))._plans[()].fb
    return fb._sessions[-1].get_session_options().intra_op_num_threads  # the last graph built: this shape's


@pytest.mark.training_build  # ortflow's own graphs (plain build) serve every shape from one session
def test_threads_follow_torch_but_small_batches_get_one():
    onx = to_onnx(fitted_mlp(hidden=(64,)))  # 8*64 + 64 + 64 + 1 = 641 float weights
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        layer = OnnxModule(onx)
        assert static_session_threads(layer, 16) == 1  # 16 x 641 values: far under the threshold
        assert static_session_threads(layer, 6000) == 2  # 3.8M: over it, torch's count
        assert static_session_threads(OnnxModule(onx, n_threads=2), 16) == 2  # an explicit count is kept
    finally:
        torch.set_num_threads(before)


def test_wrong_inputs_name_the_input():
    layer = OnnxModule(to_onnx(fitted_mlp()))
    with pytest.raises(TypeError, match=r"input 'X' has dtype torch.float64, the graph expects torch.float32"):
        layer(torch.zeros(3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"input 'X' has shape \(8,\), the graph expects \(\?, 8\) \(rank 2\)"):
        layer(torch.zeros(8))
    with pytest.raises(ValueError, match=r"input 'X' has shape \(3, 5\)"):
        layer(torch.zeros(3, 5))
    with pytest.raises(ValueError, match=r"input 'X' is on meta, the module's parameters on cpu"):
        layer(torch.zeros(3, 8, device="meta"))
    with pytest.raises(TypeError, match=r"takes 1 tensors \['X'\], got 2"):
        layer(torch.zeros(3, 8), torch.zeros(3, 8))
    with pytest.raises(TypeError, match=r"parameter 'coef_0' has dtype torch.float64, the graph expects"):
        layer.double()(torch.zeros(3, 8))


@pytest.mark.parametrize("declared", [False, True])
def test_several_inputs_and_outputs_frozen_initializer(declared, two_output_graph):
    onx = two_output_graph
    if declared:  # older graphs list initializers among the inputs too, here before the real inputs
        onx.graph.input.insert(0, helper.make_tensor_value_info("V", TensorProto.FLOAT, [2, 1]))
    layer = OnnxModule(onx, weights_to_train=["layer.0/W", "c", "V"])
    assert layer.parameter_names_ == {"layer.0/W": "layer_0_W", "c": "c", "V": "V"}
    assert "frozen" not in dict(layer.named_parameters())
    inits = {i.name: torch.tensor(numpy_helper.to_array(i)) for i in onx.graph.initializer}
    W, c, V = (inits[n].clone().requires_grad_() for n in ("layer.0/W", "c", "V"))
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 3, generator=gen), torch.randn(5, 2, generator=gen)
    a1, a2 = a.clone().requires_grad_(), a.clone().requires_grad_()
    y, z, idx = layer(a1, b)  # b needs no gradient
    aw = a2 @ W
    ey, ez = (torch.relu(aw + c) * b) @ V, aw + inits["frozen"]
    torch.testing.assert_close(y, ey)
    torch.testing.assert_close(z, ez)
    assert idx.dtype == torch.int64 and torch.equal(idx, ez.argmax(1))
    assert not idx.requires_grad
    (y.sum() + (z ** 2).sum()).backward()
    (ey.sum() + (ez ** 2).sum()).backward()
    torch.testing.assert_close(a1.grad, a2.grad)
    torch.testing.assert_close(layer.layer_0_W.grad, W.grad)
    torch.testing.assert_close(layer.c.grad, c.grad)
    torch.testing.assert_close(layer.V.grad, V.grad)
    trained = {i.name: numpy_helper.to_array(i) for i in layer.get_trained_onnx().graph.initializer}
    np.testing.assert_array_equal(trained["frozen"], inits["frozen"].numpy())


def test_parameter_name():
    assert parameter_name("a.b/c:0") == "a_b_c_0"
    assert parameter_name("0w") == "p_0w"
    assert parameter_name("class") == "p_class"
    assert parameter_name("forward") == "p_forward"
    assert parameter_name("a.b", {"a_b"}) == "a_b_1"


@pytest.mark.gpu
def test_cuda_layer_matches_cpu(regression_data):
    from ortflow._ort import ort

    if not torch.cuda.is_available() or "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("needs a GPU, torch with CUDA and the CUDA build of onnxruntime-training")
    mlp = fitted_mlp()
    cpu, gpu = OnnxModule(to_onnx(mlp)), OnnxModule(to_onnx(mlp)).to("cuda")
    X = torch.tensor(regression_data[0][:32])
    xc, xg = X.clone().requires_grad_(), X.cuda().requires_grad_()
    out_c, out_g = cpu(xc), gpu(xg)
    assert out_g.device.type == "cuda"
    torch.testing.assert_close(out_g.cpu(), out_c, rtol=1e-5, atol=1e-5)
    out_c.square().sum().backward()
    out_g.square().sum().backward()
    torch.testing.assert_close(xg.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gpu.coef_0.grad.cpu(), cpu.coef_0.grad, rtol=1e-4, atol=1e-5)
