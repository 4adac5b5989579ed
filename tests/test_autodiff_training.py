"""One standard-ONNX SGD/Adam step graph (ortflow.autodiff.training_step), run batch after batch in a plain
InferenceSession, ends with the weights of full training (OrtGradientOptimizer)."""

import warnings

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression
from sklearn.neural_network import MLPRegressor

import ortflow
from ortflow._ort import InferenceSession
from ortflow.autodiff import training_step
from ortflow.autodiff.training import STEP, UPDATED

# onnxruntime's own full training where it exists; on the plain build, the trainer's runtime of the same graph
REFERENCE = "onnxruntime" if ortflow.backend() == "training" else "ortflow"


class StepGraphLoop:
    """The step graph run batch after batch in a plain session, each step's state fed to the next: the graph
    alone, without the trainers' runtime. ``weights`` are the initial weights; the optimizer's state starts at 0."""

    def __init__(self, step, weights):
        self.session = InferenceSession(step.SerializeToString(), providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in step.graph.input]
        self.state_names = [o.name[: -len(UPDATED)] for o in step.graph.output[1:]]
        shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in step.graph.input}
        self.state = {n: np.array(weights[n], np.float32) if n in weights else np.zeros(shapes[n], np.float32)
                      for n in self.state_names}
        self.steps = 0

    def epoch(self, data, batch_size, learning_rate):
        """Consecutive batches of ``batch_size`` rows of ``data`` (X, y; the last may be shorter); their losses."""
        feeds = [n for n in self.inputs if n not in self.state and n not in ("learning_rate", STEP)]
        losses = []
        for start in range(0, len(data[0]), batch_size):
            self.steps += 1
            scalars = {"learning_rate": np.array(learning_rate, np.float32), STEP: np.array(self.steps, np.float32)}
            given = {**dict(zip(feeds, (d[start: start + batch_size] for d in data))), **self.state, **scalars}
            loss, *new = self.session.run(None, {n: given[n] for n in self.inputs})
            self.state = dict(zip(self.state_names, new))
            losses.append(float(loss))
        return np.array(losses)

    def get_weights(self):
        return {n: a.copy() for n, a in self.state.items()}


@pytest.mark.parametrize("score,penalty", [("squared_error", None), ("elastic", {"coef_0": {"l2": 0.01}})])
def test_sgd_steps_reproduce_full_training(regression_data, score, penalty):
    X, y = regression_data
    X, y = X[:95], y[:95].reshape(-1, 1)  # 10 batches of 10 rows, the last of 5
    model = ortflow.to_onnx(LinearRegression().fit(X[:8], y[:8].ravel() + 1.0))
    weight = ortflow.trainable_initializers(model)[0]
    loss = ortflow.add_loss_output(model, score, penalty=None if penalty is None else {weight: penalty["coef_0"]})
    step = training_step(loss)
    assert [i.name for i in step.graph.input][-1] == "learning_rate"
    assert all(n.domain in ("", "ai.onnx") for n in step.graph.node)
    runner = StepGraphLoop(step, ortflow.get_initializers(loss))
    for _ in range(4):
        losses = runner.epoch([X, y], batch_size=10, learning_rate=0.005)
    assert losses.shape == (10,)
    trainer = ortflow.OrtGradientOptimizer(loss, max_iter=4, batch_size=10, learning_rate=0.005, shuffle=False,
                                           gradients=REFERENCE)
    trainer.fit(X, y)
    expected = ortflow.get_initializers(trainer.get_trained_onnx())
    for name, value in runner.get_weights().items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
        assert not np.allclose(value, ortflow.get_initializers(loss)[name])  # it trained


def _mlp_loss(regression_data):
    """95 rows (batches of 10 end with one of 5) and the squared-error graph of a small MLP fitted on them."""
    X, y = regression_data
    X, y = X[:95], y[:95].reshape(-1, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ortflow.to_onnx(MLPRegressor(hidden_layer_sizes=(4,), max_iter=2, random_state=0).fit(X, y.ravel()))
    return X, y, ortflow.add_loss_output(model)


@pytest.mark.parametrize("optimizer,weight_decay", [("adam", 0.0), ("adamw", 0.1)])
def test_adam_steps_reproduce_full_training(regression_data, optimizer, weight_decay):
    """Adam divides each gradient by its running magnitude, so float32 rounding of tiny gradient components is
    amplified: the weights agree to 1e-5 absolute after 30 steps (they moved by ~0.2)."""
    X, y, loss = _mlp_loss(regression_data)
    step = training_step(loss, optimizer=optimizer, weight_decay=weight_decay)
    inputs = [i.name for i in step.graph.input]
    assert inputs[-2:] == ["learning_rate", "step"] and "coef_0_m" in inputs and "coef_0_v" in inputs
    runner = StepGraphLoop(step, ortflow.get_initializers(loss))
    for _ in range(3):
        runner.epoch([X, y], batch_size=10, learning_rate=0.01)
    rate = (ortflow.LearningRateAdam(eta0=0.01) if optimizer == "adam"
            else ortflow.LearningRateAdamW(eta0=0.01, weight_decay=weight_decay))
    trainer = ortflow.OrtGradientOptimizer(loss, max_iter=3, batch_size=10, learning_rate=rate, shuffle=False,
                                           gradients=REFERENCE)
    trainer.fit(X, y)
    expected = ortflow.get_initializers(trainer.get_trained_onnx())
    got = runner.get_weights()
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
        assert np.abs(value - ortflow.get_initializers(loss)[name]).max() > 0.05  # it trained


def test_full_training_runs_one_graph_per_batch_shape_with_the_symbolic_graphs_results(regression_data):
    """Full training builds a step graph per batch size it meets (10 rows, and the last batch of 5), whose counts
    are constants; it ends with the weights of the one graph with a symbolic batch axis."""
    X, y, loss = _mlp_loss(regression_data)
    symbolic, fixed = training_step(loss), training_step(loss, batch_rows=10)
    ops = [[n.op_type for n in m.graph.node] for m in (symbolic, fixed)]
    assert "Size" in ops[0] and "Size" not in ops[1] and len(ops[1]) < len(ops[0])
    runner = StepGraphLoop(symbolic, ortflow.get_initializers(loss))
    for _ in range(3):
        runner.epoch([X, y], batch_size=10, learning_rate=0.01)
    trainer = ortflow.OrtGradientOptimizer(loss, max_iter=3, batch_size=10, learning_rate=0.01, shuffle=False,
                                           gradients="ortflow").fit(X, y)
    assert sorted(trainer._rt_batches) == [5, 10]  # the batch loop built one step graph batch per size
    got = ortflow.get_initializers(trainer.get_trained_onnx())
    for name, value in runner.get_weights().items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_bad_settings_are_refused(regression_data):
    X, y = regression_data
    loss = ortflow.add_loss_output(ortflow.to_onnx(LinearRegression().fit(X, y)))
    with pytest.raises(ValueError, match="optimizer='lbfgs'"):
        training_step(loss, optimizer="lbfgs")
    with pytest.raises(ValueError, match="weight_decay=0.1 applies to optimizer='adamw' only"):
        training_step(loss, optimizer="adam", weight_decay=0.1)
    with pytest.raises(ValueError, match="loss output 'variable' has rank 2; training_step needs a scalar loss"):
        training_step(loss, loss_output="variable")


@pytest.mark.parametrize("rows", [None, 3])
def test_a_double_loss_over_float_weights_takes_plain_sgd_steps(rows):
    """The learning rate (float) seeds the backward pass of float losses only; a double loss is scaled at the end."""
    from onnx import TensorProto, helper, numpy_helper
    from ortflow._ort import InferenceSession

    W = np.array([[0.5], [-1.0]], dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["X", "W"], ["p"]), helper.make_node("Cast", ["p"], ["pd"], to=TensorProto.DOUBLE),
             helper.make_node("Sub", ["pd", "y"], ["d"]), helper.make_node("Mul", ["d", "d"], ["dd"]),
             helper.make_node("ReduceMean", ["dd"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2]),
                                           helper.make_tensor_value_info("y", TensorProto.DOUBLE, [None, 1])],
                              [helper.make_tensor_value_info("loss", TensorProto.DOUBLE, [])],
                              [numpy_helper.from_array(W, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    step = training_step(model, batch_rows=rows)
    session = InferenceSession(step.SerializeToString(), providers=["CPUExecutionProvider"])
    X, y = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float32), np.array([[1.0], [2.0], [3.0]])
    loss, updated = session.run(None, {"X": X, "y": y, "W": W, "learning_rate": np.array(0.1, dtype=np.float32)})
    residual = (X @ W).astype(np.float64) - y
    assert loss == pytest.approx(float((residual ** 2).mean()))
    np.testing.assert_allclose(updated, W - 0.1 * 2 * X.T.astype(np.float64) @ residual / 3, rtol=1e-5)


def test_transformer_step_with_fixed_rows_has_static_shapes_and_the_same_gradients():
    """Issue 39: on CUDA the transformer's step spent a third of its time in 10 ``NonZero`` nodes (the broadcast
    axes of the attention's batched MatMul gradients, found at run time: a device sync and a host copy each). With
    the batch rows fixed every shape is settled, so the graph holds no NonZero, and its gradients are the symbolic
    graph's: within float32's bound of a sum whose terms are the per-row gradients (derived from their magnitudes,
    the batch's gradient being their mean)."""
    import reference_data
    from tolerances import assert_close, float32_sum_atol

    ref = reference_data.load("transformer")
    loss = ortflow.add_loss_output(ref.model, "log")
    rows, tokens = 8, ref.inputs.shape[1]
    fixed, symbolic = training_step(loss, batch_rows=rows), training_step(loss)
    assert not [n.name for n in fixed.graph.node if n.op_type == "NonZero"]
    weights = ortflow.get_initializers(loss)

    def gradients(step, X, y):
        """Every weight's gradient at the start (SGD at rate 1: the update is ``w - g``)."""
        session = InferenceSession(step.SerializeToString(), providers=["CPUExecutionProvider"])
        data = {"tokens": X, "label": y, "learning_rate": np.array(1.0, np.float32)}
        feeds = {i.name: weights[i.name] if i.name in weights else data[i.name] for i in session.get_inputs()}
        names = [o.name[: -len(UPDATED)] for o in step.graph.output[1:]]
        return {n: weights[n].astype(np.float64) - u for n, u in zip(names, session.run(None, feeds)[1:])}

    X, y = ref.inputs[:rows], ref.one_hot[:rows]
    got, expected = gradients(fixed, X, y), gradients(symbolic, X, y)
    per_row = [gradients(symbolic, X[i: i + 1], y[i: i + 1]) for i in range(rows)]
    for name, value in expected.items():
        terms = sum(np.abs(g[name]) for g in per_row) / rows
        # the sum over rows and tokens, and the update's rounding of w on either side
        atol = float32_sum_atol(terms, rows * tokens) + 4 * np.finfo(np.float32).eps * np.abs(weights[name])
        assert_close(got[name], value, rtol=0, atol=atol, err_msg=name)


def test_shapes_are_measured_only_where_values_do_not_decide_them():
    """A reshape to a shape computed from the input's shape is measured (its value_info gets the fixed shape);
    one to a shape fed as data is not (a run on zeros would measure the zeros' shape), nor a graph with NonZero."""
    from onnx import TensorProto, helper

    from ortflow.autodiff.measured_shapes import with_measured_shapes

    def graph(shape_from_data: bool, nonzero: bool = False):
        nodes = [helper.make_node("Shape", ["X"], ["s"]),
                 helper.make_node("Div", ["s", "two"], ["half"]),  # onnx's data propagation stops at Div
                 helper.make_node("Concat", ["half", "two"], ["target"], axis=0),
                 helper.make_node("Reshape", ["X", "given" if shape_from_data else "target"], ["Y"]),
                 helper.make_node("Relu", ["Y"], ["Z"])]
        if nonzero:
            nodes.append(helper.make_node("NonZero", ["X"], ["nz"]))
        inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 6])]
        if shape_from_data:
            inputs.append(helper.make_tensor_value_info("given", TensorProto.INT64, [4]))
        two = helper.make_tensor("two", TensorProto.INT64, [2], [2, 2])
        outputs = [helper.make_tensor_value_info("Z", TensorProto.FLOAT, None)]
        return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, [two]),
                                 opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    measured = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in with_measured_shapes(graph(False)).graph.value_info}
    assert measured["Y"] == [2, 3, 2, 2]  # (4, 6) reshaped to (4/2, 6/2, 2, 2): what inference left open
    for model in (graph(True), graph(False, nonzero=True)):
        assert with_measured_shapes(model) is model
