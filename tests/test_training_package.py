"""Training packages (ortflow.package): the exported step graph trained by the reference loop reaches the weights
the Python trainers reach on the same batches, a state comes back as the trained graph, and bad input is refused
naming what is wrong.

Tolerance rule (weights after ``s`` optimizer steps of two float32 evaluations of the same step graphs): each step
rounds every weight a few times (``TERM_ROUNDINGS`` of ``tests/tolerances.py``) at the scale of the weights, and
those roundings accumulate over the steps: ``|a - b| <= 2 * s * TERM_ROUNDINGS * u32 * max|w|`` per tensor (``u32``
the float32 unit roundoff). Identical graphs on one machine usually agree bit for bit; the rule covers a reordered
sum (the Python trainer runs a graph built for a fixed batch size, the package one for a symbolic batch).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from sklearn.datasets import load_digits, make_classification, make_regression
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.neural_network import MLPRegressor

import ortflow
from ortflow import (
    LearningRateAdam,
    LearningRateSGD,
    OrtGradientForwardBackwardOptimizer,
    OrtGradientOptimizer,
    TrainingPackageError,
    add_loss_output,
    to_onnx,
)
from ortflow._ort import InferenceSession
from ortflow.exceptions import ConvergenceError
from ortflow.package import (
    FLAT_STEP_FILE,
    FORMAT,
    STATE_FILE,
    TrainingPackage,
    TrainingState,
    average_states,
    load_training_state,
    _targets,
    train_package,
)
from ortflow.package import unrolled_bound
from ortflow.package.graphs import MAX_UNROLLED_NODES
from ortflow.data.shuffle import draws, epoch_order, seed_state
from sklearn_fit import quiet_fit
from tolerances import TERM_ROUNDINGS, U32


def _regression(n=60, features=5):
    X, y = make_regression(n, n_features=features, noise=1.0, random_state=0)
    return X.astype(np.float32), (y / 50).astype(np.float32)


def _case(name):
    """(loss graph, X, y) of the four models of issue 38."""
    if name == "linear":
        X, y = _regression()
        return add_loss_output(to_onnx(LinearRegression().fit(X, y)), "squared_error"), X, y
    if name == "mlp":
        X, y = _regression()
        mlp = quiet_fit(MLPRegressor(hidden_layer_sizes=(8,), max_iter=2, random_state=0), X, y)
        return add_loss_output(to_onnx(mlp), "squared_error"), X, y
    if name == "binary":
        X, y = make_classification(60, n_features=6, random_state=0)
        X = X.astype(np.float32)
        return add_loss_output(to_onnx(quiet_fit(LogisticRegression(max_iter=2), X, y)), "log"), X, y
    X, y = load_digits(return_X_y=True)
    X, y = (X[:120] / 16).astype(np.float32), y[:120]
    return add_loss_output(to_onnx(quiet_fit(LogisticRegression(max_iter=2), X, y)), "log"), X, y


OPTIMIZERS = {"sgd": lambda: LearningRateSGD(eta0=0.05, learning_rate="invscaling", power_t=0.25),
              "adam": lambda: LearningRateAdam(eta0=0.01)}


def _atol(reference: np.ndarray, steps: int) -> float:
    return 2 * steps * TERM_ROUNDINGS * U32 * float(np.abs(reference).max())


def _assert_same_weights(state: TrainingState, weights: dict, steps: int) -> None:
    assert set(state.weights) == set(weights)
    for name, value in weights.items():
        np.testing.assert_allclose(state.weights[name], value, rtol=0, atol=_atol(value, steps), err_msg=name)


@pytest.fixture(scope="module")
def linear_package(tmp_path_factory):
    onx, X, y = _case("linear")
    folder = tmp_path_factory.mktemp("pkg") / "linear"
    ortflow.export_training_package(OrtGradientOptimizer(onx, batch_size=16, learning_rate="adam"), folder)
    return folder, X, y


# --- the generator shared with JavaScript ---------------------------------------------------------------------
def test_the_shuffle_generator_gives_its_documented_values():
    """These values are in docs/TRAINING_OUTSIDE_PYTHON.md: another runtime checks its generator against them (they
    were computed by the JavaScript definition of the docs, in Node)."""
    assert seed_state(42, 3) == 42 ^ ((3 * 0x9E3779B9) & 0xFFFFFFFF)
    assert draws(seed_state(42, 3), 5) == [577773191, 1464791224, 3429284904, 2755160992, 171570020]
    assert draws(seed_state(0, 0), 5) == [1144304738, 1416247, 958946056, 627933444, 2007157716]
    assert draws(seed_state(0xFFFFFFFF, 7), 5) == [584321870, 2042417294, 921295219, 3452007454, 2203739969]
    assert epoch_order(10, 42, 3).tolist() == [5, 8, 9, 6, 7, 2, 3, 0, 4, 1]
    assert epoch_order(10, 42, 4).tolist() == [7, 4, 0, 3, 6, 8, 1, 5, 9, 2]
    assert epoch_order(12, 2026, 0).tolist() == [0, 11, 5, 8, 10, 4, 9, 1, 6, 2, 3, 7]
    assert sorted(epoch_order(1000, 7, 0).tolist()) == list(range(1000))
    assert epoch_order(1, 5, 0).tolist() == [0] and epoch_order(0, 5, 0).tolist() == []


# --- the package trains as the Python trainer does ------------------------------------------------------------
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("model", ["linear", "mlp", "binary", "ten_classes"])
def test_the_reference_loop_reaches_the_trainers_weights(tmp_path, model, optimizer):
    onx, X, y = _case(model)
    est = OrtGradientOptimizer(onx, max_iter=3, batch_size=16, shuffle=False, learning_rate=OPTIMIZERS[optimizer]())
    folder = ortflow.export_training_package(est, tmp_path / "pkg")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format"] == FORMAT and manifest["format_version"] == 1
    assert manifest["ir_version"] <= 10 and manifest["batch_size"] == 16
    assert manifest["optimizer"]["name"] == optimizer
    if model in ("binary", "ten_classes"):
        assert manifest["target"]["classes"] == np.unique(y).tolist()
        assert manifest["target"]["encoding"] == ("one_hot" if model == "ten_classes" else "binary")
    est.fit(X, y)
    state = train_package(folder, X, y, epochs=3, shuffle=False)  # 60 or 120 rows: a short last batch
    steps = 3 * -(-len(X) // 16)
    assert state.steps == steps and state.epochs == 3 and state.rows_seen == 3 * len(X)
    _assert_same_weights(state, est.get_state(), steps)
    predicted = InferenceSession(state.trained_onnx_bytes(), providers=["CPUExecutionProvider"]).run(None, {"X": X})
    expected = est._run_prediction(X)
    for name, value in zip([o["name"] for o in manifest["predict"]["outputs"]], predicted):
        if value.dtype.kind == "f":
            np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(value, expected[name])


def test_shuffled_batches_follow_the_shared_generator(tmp_path):
    """The trainer fed each epoch's rows in ``epoch_order`` (one epoch per warm-started fit) ends where the package
    trained with ``shuffle=True`` ends."""
    onx, X, y = _case("mlp")
    est = OrtGradientOptimizer(onx, max_iter=1, batch_size=16, shuffle=False, warm_start=True,
                               learning_rate=LearningRateAdam(eta0=0.01))
    folder = ortflow.export_training_package(est, tmp_path / "pkg")
    for epoch in range(3):
        order = epoch_order(len(X), 11, epoch)
        est.fit(X[order], y[order])
    state = train_package(folder, X, y, epochs=3, seed=11)
    _assert_same_weights(state, est.get_state(), state.steps)
    unshuffled = train_package(folder, X, y, epochs=3, shuffle=False)
    assert not np.allclose(unshuffled.weights["coef_0"], state.weights["coef_0"])


def test_a_trainer_with_the_portable_shuffle_takes_the_packages_batches(tmp_path):
    """``shuffle='portable'``: the Python trainer draws each epoch's order from the same generator and seed as the
    package (and the JavaScript trainer), so the same seed gives the same batches, and the same weights."""
    onx, X, y = _case("mlp")
    est = OrtGradientOptimizer(onx, max_iter=3, batch_size=16, shuffle="portable", random_state=11,
                               learning_rate=LearningRateAdam(eta0=0.01))
    folder = ortflow.export_training_package(est, tmp_path / "pkg")
    state = train_package(folder, X, y, epochs=3, seed=11)
    est.fit(X, y)
    _assert_same_weights(state, est.get_state(), state.steps)
    with pytest.raises(ValueError, match=r"random_state=None must be an int"):
        OrtGradientOptimizer(onx, shuffle="portable").fit(X, y)
    with pytest.raises(TypeError, match=r"shuffle='random' must be True, False or 'portable'"):
        OrtGradientOptimizer(onx, shuffle="random").fit(X, y)


@pytest.mark.parametrize("model", ["mlp", "ten_classes"])
def test_the_flat_step_graph_takes_the_same_steps(tmp_path, model):
    """``step_flat.onnx`` (the whole state as one vector, split inside) holds the same nodes: the same weights, bit
    for bit, shuffled batches and a short last batch included."""
    onx, X, y = _case(model)
    est = OrtGradientOptimizer(onx, batch_size=16, learning_rate=LearningRateAdam(eta0=0.01))
    folder = ortflow.export_training_package(est, tmp_path / "pkg")
    flat = TrainingPackage(folder).manifest["step_flat"]
    total = sum(int(np.prod(t.shape)) for t in TrainingPackage(folder).tensors)
    assert [o["name"] for o in flat["outputs"]] == ["loss", "state_updated"]
    assert next(i for i in flat["inputs"] if i["name"] == "state")["shape"] == [total]
    by_tensor = train_package(folder, X, y, epochs=2, seed=4)
    by_vector = train_package(folder, X, y, epochs=2, seed=4, flat=True)
    for name, value in by_tensor.tensors.items():
        np.testing.assert_array_equal(by_vector.tensors[name], value, err_msg=name)


@pytest.mark.parametrize("model", ["mlp", "ten_classes"])
def test_the_unrolled_graphs_take_the_same_steps(tmp_path, model):
    """``steps_<K>.onnx`` runs K flat steps in one run: from a state and step number 5 (Adam reads it), K batches
    give the K losses and the state of K runs of ``step_flat.onnx``, bit for bit; ``train_package(unrolled=True)``
    (runs of 4 and 2 full batches, then single steps: 60 and 120 rows in batches of 7, shuffled) ends where the
    flat loop ends, bit for bit."""
    onx, X, y = _case(model)
    est = OrtGradientOptimizer(onx, batch_size=7, learning_rate=LearningRateAdam(eta0=0.01))
    folder = ortflow.export_training_package(est, tmp_path / "pkg", max_unrolled=4)
    package = TrainingPackage(folder)
    unrolled = package.manifest["unrolled"]
    assert [(u["steps"], u["file"], u["rows"]) for u in unrolled] == [(2, "steps_2.onnx", 14), (4, "steps_4.onnx", 28)]
    assert [o["name"] for o in unrolled[1]["outputs"]] == ["losses", "state_updated"]
    assert unrolled[1]["outputs"][0]["shape"] == [4]

    trained = train_package(folder, X, y, epochs=1, seed=1, flat=True)  # a state that is not the initial one
    vector = np.concatenate([trained.tensors[t.name].ravel() for t in package.tensors])
    feeds = {"X": X[:28], package.manifest["target"]["name"]: _targets(package.manifest, y[:28], 28),
             "learning_rate": np.array(0.01, np.float32), "step": np.array(5, np.float32)}
    single = InferenceSession(package.read(FLAT_STEP_FILE), providers=["CPUExecutionProvider"])
    losses, state = [], vector
    for i in range(4):
        run = {k: v[7 * i: 7 * i + 7] if v.ndim else v for k, v in feeds.items()}
        loss, state = single.run(None, {**run, "state": state, "step": np.array(5 + i, np.float32)})
        losses.append(loss)
    many = InferenceSession(package.read("steps_4.onnx"), providers=["CPUExecutionProvider"])
    got_losses, got_state = many.run(None, {**feeds, "state": vector})
    np.testing.assert_array_equal(got_losses, np.array(losses, np.float32).ravel())
    np.testing.assert_array_equal(got_state, state)
    assert not np.array_equal(state, vector)

    one_by_one = train_package(folder, X, y, epochs=2, seed=4, flat=True)
    by_runs = train_package(folder, X, y, epochs=2, seed=4, unrolled=True)
    assert by_runs.steps == one_by_one.steps == 2 * -(-len(X) // 7)
    for name, value in one_by_one.tensors.items():
        np.testing.assert_array_equal(by_runs.tensors[name], value, err_msg=name)


def test_the_unrolled_graphs_follow_the_steps_cost(linear_package, tmp_path):
    """By default a step of a few weights gets unrolled graphs of 2, 4... 32 steps, and fewer when its graph has many
    nodes (``MAX_UNROLLED_NODES`` in the largest: 5 times this step's nodes, 4), a step of D-wide (92,000 weights in
    batches of 256) up to 4, a step of 20 times more none; ``max_unrolled=0`` writes none, a negative bound is
    refused. An overflowing loss inside an unrolled run is named at its own step, as the flat loop names it."""
    folder, X, y = linear_package
    manifest = TrainingPackage(folder).manifest
    flat = onnx.load_from_string(TrainingPackage(folder).read(FLAT_STEP_FILE))
    assert unrolled_bound(flat, 16, ["coef"], {"coef": np.zeros(6)}) == 32
    assert [u["steps"] for u in manifest["unrolled"]] == [2, 4, 8, 16, 32]
    many = onnx.ModelProto()
    many.CopyFrom(flat)
    for _ in range(4):
        many.graph.node.extend(flat.graph.node)
    assert 4 * len(many.graph.node) <= MAX_UNROLLED_NODES < 8 * len(many.graph.node)
    assert unrolled_bound(many, 16, ["coef"], {"coef": np.zeros(6)}) == 4
    assert unrolled_bound(flat, 256, ["coef"], {"coef": np.zeros(92_000)}) == 4
    assert unrolled_bound(flat, 256, ["coef"], {"coef": np.zeros(20 * 92_000)}) == 1
    onx, _, _ = _case("linear")
    none = ortflow.export_training_package(OrtGradientOptimizer(onx, batch_size=16), tmp_path / "none",
                                           max_unrolled=0)
    assert TrainingPackage(none).manifest["unrolled"] == [] and not list(none.glob("steps_*"))
    with pytest.raises(TrainingPackageError, match="max_unrolled=-1 must be an integer >= 0"):
        ortflow.export_training_package(OrtGradientOptimizer(onx), tmp_path / "bad", max_unrolled=-1)
    big = X.copy()
    big[20:] = 1e20  # the second batch (rows 16-31, in the first run of steps_2.onnx) overflows
    messages, states = [], []
    for kwargs in ({"flat": True}, {"unrolled": True}, {}):
        with pytest.raises(ConvergenceError) as caught:
            train_package(folder, big, y, shuffle=False, **kwargs)
        messages.append(str(caught.value))
        states.append(caught.value.state)
    assert messages[0] == messages[1] == messages[2] and "epoch 1, step 2" in messages[0]
    # the state before the bad step: the one a run of the first batch alone reaches, unrolled or not
    first = train_package(folder, X[:16], y[:16], shuffle=False, flat=True)
    for state in states:
        assert (state.epochs, state.steps, state.rows_seen) == (0, 1, 16)
        for name, value in first.tensors.items():
            np.testing.assert_array_equal(state.tensors[name], value, err_msg=name)


def test_the_reference_loop_reports_each_epoch(linear_package):
    """``on_epoch(record)`` gets the record the JavaScript library's ``logs`` hold (INTERFACES.md): the epoch, its
    mean loss, the steps, the rows seen and the epoch's learning rate (float32, the schedule's)."""
    folder, X, y = linear_package
    records = []
    state = train_package(folder, X, y, epochs=2, seed=3, on_epoch=records.append)
    package = TrainingPackage(folder)
    steps = -(-len(X) // 16)
    assert [sorted(r) for r in records] == [["epoch", "learning_rate", "loss", "rows_seen", "steps"]] * 2
    assert [(r["epoch"], r["steps"], r["rows_seen"]) for r in records] == [(1, steps, len(X)), (2, 2 * steps,
                                                                                               2 * len(X))]
    assert records[1]["learning_rate"] == float(np.float32(package.learning_rate(len(X))))
    assert all(np.isfinite(r["loss"]) for r in records) and state.steps == 2 * steps


@pytest.mark.parametrize("kind", ["full", "fwbw"])
def test_a_fitted_trainer_exports_its_weights_moments_and_progress(tmp_path, kind):
    """A package of a fitted trainer continues its training: one more epoch of the package equals one more
    warm-started epoch of the trainer (Adam's moments and step count, the schedule's rows seen carried over; for
    forward-backward training, from ``get_optimizer_state``)."""
    onx, X, y = _case("mlp")
    settings = dict(max_iter=2, batch_size=16, shuffle=False, warm_start=True,
                    learning_rate=LearningRateAdam(eta0=0.01))
    if kind == "full":
        est = OrtGradientOptimizer(onx, **settings).fit(X, y)
    else:
        outputs = [o.name for o in onx.graph.output if o.name != "loss"]
        est = OrtGradientForwardBackwardOptimizer(ortflow.graph.editing.keep_outputs(onx, outputs), **settings).fit(X, y)
    folder = ortflow.export_training_package(est, tmp_path / "pkg")
    start = TrainingPackage(folder).initial_state()
    assert (start.epochs, start.steps, start.rows_seen) == (2, 8, 120)
    assert np.abs(start.tensors["coef_0_m"]).max() > 0
    state = train_package(folder, X, y, epochs=1, shuffle=False)
    est.set_params(max_iter=1).fit(X, y)
    _assert_same_weights(state, est.get_state(), state.steps)


def test_a_forward_backward_trainer_exports_the_same_training(tmp_path):
    X, y = _regression()
    onx = to_onnx(LinearRegression().fit(X, y))
    est = OrtGradientForwardBackwardOptimizer(onx, max_iter=3, batch_size=16, shuffle=False,
                                              learning_rate=LearningRateSGD(eta0=0.05, learning_rate="invscaling"))
    folder = ortflow.export_training_package(est, tmp_path / "pkg")
    est.fit(X, y)
    state = train_package(folder, X, y, epochs=3, shuffle=False)
    _assert_same_weights(state, est.get_state(), state.steps)


@pytest.mark.parametrize("kind", ["fwbw", "torch"])
def test_a_prediction_graphs_package_trains_as_the_full_trainers(tmp_path, kind):
    """Every trainer exports its ``training_problem()``: the package of a forward-backward or a torch trainer of a
    prediction graph (its loss a family's) trains, in the reference loop, as the full trainer's package of the same
    graph and loss; the registry's family 'trainer' gives back the class, whose ``from_state`` continues the
    package's state."""
    if kind == "torch":
        pytest.importorskip("torch")
    from ortflow.registry import family

    cls = OrtGradientForwardBackwardOptimizer if kind == "fwbw" else ortflow.TorchTrainer
    onx, X, y = _case("mlp")
    prediction = ortflow.graph.editing.keep_outputs(onx, [o.name for o in onx.graph.output if o.name != "loss"])
    settings = dict(batch_size=16, learning_rate=LearningRateAdam(eta0=0.01))
    full = ortflow.export_training_package(OrtGradientOptimizer(onx, **settings), tmp_path / "full")
    other = ortflow.export_training_package(cls(prediction, learning_loss="squared_error", **settings),
                                            tmp_path / kind)
    assert TrainingPackage(other).manifest["trainer"] == cls.__name__
    expected = train_package(full, X, y, epochs=2, shuffle=False)
    state = train_package(other, X, y, epochs=2, shuffle=False)
    assert state.steps == expected.steps == 8
    _assert_same_weights(state, expected.weights, state.steps)
    going_on = family("trainer")[cls.__name__].from_state(state, max_iter=1, shuffle=False)
    assert type(going_on) is cls and going_on.batch_size == 16
    assert going_on.learning_loss.names[0] == "squared_error"
    start = {i.name: onnx.numpy_helper.to_array(i) for i in going_on.model_onnx.graph.initializer}
    for name, value in state.weights.items():
        np.testing.assert_array_equal(start[name], value)
    fresh = cls(prediction, learning_loss="squared_error", max_iter=1, shuffle=False, **settings).fit(X, y)
    assert going_on.fit(X, y).train_losses_[0] < fresh.train_losses_[0]  # it starts from the trained weights


@pytest.mark.parametrize("kind", ["full", "fwbw", "torch"])
def test_every_trainer_says_what_it_trains_as_one_problem(kind):
    """``training_problem()`` of a fitted trainer: its state table holds the weights and the optimizer's slots under
    one spelling (``state_tensor``), the public optimizer state read back from it is ``get_optimizer_state()``'s,
    the progress is the fit's."""
    if kind == "torch":
        pytest.importorskip("torch")
    from ortflow.trainers.problem import state_tensor

    onx, X, y = _case("mlp")
    prediction = ortflow.graph.editing.keep_outputs(onx, [o.name for o in onx.graph.output if o.name != "loss"])
    settings = dict(batch_size=16, max_iter=2, shuffle=False, learning_rate=LearningRateAdam(eta0=0.01))
    est = (OrtGradientOptimizer(onx, **settings) if kind == "full" else
           (OrtGradientForwardBackwardOptimizer if kind == "fwbw" else ortflow.TorchTrainer)(
               prediction, learning_loss="squared_error", **settings)).fit(X, y)
    problem = est.training_problem()
    assert problem.trainer == type(est).__name__ and problem.batch_size == 16 and problem.slots == ("m", "v")
    assert problem.progress == {"epochs": 2, "steps": 8, "rows_seen": 120}
    assert set(problem.state) == {*problem.weights, *(state_tensor(w, s) for w in problem.weights for s in "mv")}
    assert problem.data_inputs == ["X"] and problem.prediction_output == "variable"
    public = est.get_optimizer_state()
    read = problem.optimizer_state()
    assert sorted(read) == sorted(public)
    for key, value in public.items():
        np.testing.assert_array_equal(read[key], value, err_msg=key)
    for name, value in est.get_state().items():
        np.testing.assert_array_equal(problem.state[name], value, err_msg=name)


# --- states back in Python ------------------------------------------------------------------------------------
def test_a_state_round_trips_into_a_graph_and_an_estimator(tmp_path):
    onx, X, y = _case("binary")
    est = OrtGradientOptimizer(onx, max_iter=2, batch_size=16, shuffle=False, learning_rate="adam")
    folder = ortflow.export_training_package(est, tmp_path / "pkg")
    est.fit(X, y)
    state = train_package(folder, X, y, epochs=2, shuffle=False)
    path = tmp_path / "client.state"
    path.write_bytes(state.to_bytes())
    back = load_training_state(folder, path)
    assert (back.epochs, back.steps, back.rows_seen, back.rows) == (2, 8, 120, 60)
    for name, value in state.tensors.items():
        np.testing.assert_array_equal(back.tensors[name], value)
    session = InferenceSession(back.get_trained_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
    label, proba = session.run(["output_label", "output_probability"], {"X": X})
    np.testing.assert_array_equal(label, est.predict(X))
    np.testing.assert_allclose(proba, est.predict_proba(X), rtol=1e-5, atol=1e-6)
    going_on = back.estimator(max_iter=1, shuffle=False).fit(X, y)
    assert going_on.train_losses_[0] < est.train_losses_[0]  # its first epoch starts from the trained weights
    assert going_on.batch_size == 16 and going_on.learning_rate.get_params() == LearningRateAdam().get_params()


def test_average_states_weights_by_rows(linear_package):
    folder, X, y = linear_package
    a = train_package(folder, X[:40], y[:40], epochs=1, seed=1)
    b = train_package(folder, X[40:], y[40:], epochs=1, seed=2)
    mean = average_states([a, b])
    assert mean.rows == 60
    for name in a.tensors:
        np.testing.assert_allclose(mean.tensors[name], (40 * a.tensors[name] + 20 * b.tensors[name]) / 60,
                                   rtol=1e-6, atol=1e-7)


# --- bad input ------------------------------------------------------------------------------------------------
def _copy(folder, tmp_path):
    import shutil

    return shutil.copytree(folder, tmp_path / "copy")


def test_negative_or_all_zero_sample_weights_are_refused(tmp_path):
    """Seen (issue 45 item 11): ``train_package`` took negative sample weights (a negative loss: the model pushed
    away from its rows), which the trainers and the JavaScript library refuse; it now refuses them naming the row."""
    X, y = _regression()
    est = OrtGradientForwardBackwardOptimizer(to_onnx(LinearRegression().fit(X, y)), batch_size=16)
    folder = ortflow.export_training_package(est, tmp_path / "weighted")  # forward-backward: a sample weight input
    w = np.ones(len(y), np.float32)
    w[7] = -0.5
    with pytest.raises(TrainingPackageError, match=r"sample_weight has negative values \(row 7: -0.5\)"):
        train_package(folder, X, y, sample_weight=w)
    with pytest.raises(TrainingPackageError, match="sample_weight is zero everywhere"):
        train_package(folder, X, y, sample_weight=np.zeros(len(y)))
    assert train_package(folder, X, y, sample_weight=np.abs(w)).steps > 0


def test_a_package_of_another_format_version_is_refused(linear_package, tmp_path):
    folder = _copy(linear_package[0], tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["format_version"] = 2
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TrainingPackageError, match="format_version 2; this ortflow reads version 1"):
        TrainingPackage(folder)


def test_a_file_that_does_not_match_its_checksum_is_named(linear_package, tmp_path):
    folder = _copy(linear_package[0], tmp_path)
    data = bytearray((folder / STATE_FILE).read_bytes())
    data[0] ^= 1
    (folder / STATE_FILE).write_bytes(bytes(data))
    with pytest.raises(TrainingPackageError, match="'state.bin' of the package .* does not match its checksum"):
        train_package(folder, *linear_package[1:])


def _state_with(state: TrainingState, **changes) -> bytes:
    """``state``'s file with its header changed (``tensors`` a function of the table) or its data replaced."""
    data = state.to_bytes()
    length = int.from_bytes(data[4:8], "little")
    header = json.loads(data[8: 8 + length])
    body = changes.pop("body", data[8 + length:])
    if "tensors" in changes:
        header["tensors"] = changes.pop("tensors")(header["tensors"])
    header.update(changes)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 4)
    return data[:4] + len(raw).to_bytes(4, "little") + raw + body


def test_a_state_of_other_names_or_shapes_is_refused(linear_package):
    folder = linear_package[0]
    state = TrainingPackage(folder).initial_state()

    def renamed(table):
        table[0]["name"] = "other"
        return table

    def reshaped(table):
        table[0]["shape"] = [1, table[0]["shape"][0] * table[0]["shape"][1]] if len(table[0]["shape"]) == 2 else [7]
        return table

    with pytest.raises(TrainingPackageError, match=r"missing \['coef'\], unknown \['other'\]"):
        load_training_state(folder, _state_with(state, tensors=renamed))
    with pytest.raises(TrainingPackageError, match=r"other shapes \['coef: "):
        load_training_state(folder, _state_with(state, tensors=reshaped))
    with pytest.raises(TrainingPackageError, match="trained from another package"):
        load_training_state(folder, _state_with(state, package_id="0" * 64))
    with pytest.raises(TrainingPackageError, match=r"announces \d+ bytes of values, the file holds \d+ \(truncated\)"):
        load_training_state(folder, state.to_bytes()[:-4])
    with pytest.raises(TrainingPackageError, match="not an ortflow training state"):
        load_training_state(folder, b"PK\x03\x04...")


def test_non_finite_values_in_a_state_or_the_data_are_named(linear_package):
    folder, X, y = linear_package
    state = TrainingPackage(folder).initial_state()
    body = bytearray(state.to_bytes()[-state.package.manifest["state"]["bytes"]:])
    body[0:4] = np.float32(np.nan).tobytes()
    with pytest.raises(TrainingPackageError, match="tensor 'coef' holds 1 non-finite value"):
        load_training_state(folder, _state_with(state, body=bytes(body)))
    X_bad = X.copy()
    X_bad[3, 2] = np.inf
    with pytest.raises(TrainingPackageError, match=r"X \('X'\) holds a non-finite value \(Infinity\) at row 3, column 2"):
        train_package(folder, X_bad, y)
    y_bad = y.copy()
    y_bad[5] = np.nan
    with pytest.raises(TrainingPackageError, match=r"y holds a non-finite value \(NaN\) at row 5\b"):
        train_package(folder, X, y_bad)


def test_labels_outside_the_classes_are_named(tmp_path):
    onx, X, y = _case("binary")
    folder = ortflow.export_training_package(OrtGradientOptimizer(onx, batch_size=16), tmp_path / "pkg")
    y_bad = y.copy()
    y_bad[:2] = 7
    with pytest.raises(TrainingPackageError, match=r"labels \[7\] that are not among the classes"):
        train_package(folder, X, y_bad)


def test_an_existing_package_is_not_overwritten(linear_package, tmp_path):
    folder = _copy(linear_package[0], tmp_path)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    onx, *_ = _case("mlp")
    with pytest.raises(TrainingPackageError, match="exists and is not empty; pass overwrite=True"):
        ortflow.export_training_package(OrtGradientOptimizer(onx), folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    ortflow.export_training_package(OrtGradientOptimizer(onx), folder, overwrite=True)
    assert TrainingPackage(folder).weights == ["coef_0", "intercept_0", "coef_1", "intercept_1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]  # no temporary folder left


def test_what_a_package_cannot_hold_is_refused(tmp_path):
    X, y = _regression()
    onx = to_onnx(LinearRegression().fit(X, y))
    with pytest.raises(TrainingPackageError, match="learning_penalty='elastic'.* train without one"):
        ortflow.export_training_package(OrtGradientForwardBackwardOptimizer(onx, learning_penalty="elastic"),
                                        tmp_path / "pkg")
    with pytest.raises(TrainingPackageError, match="takes an OrtGradientOptimizer .*, not LinearRegression"):
        ortflow.export_training_package(LinearRegression(), tmp_path / "pkg")
    assert not (tmp_path / "pkg").exists()


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_lenet_exported_from_pytorch_trains_in_its_package(tmp_path, optimizer):
    """The CNN exported from PyTorch (tests/data/reference): Conv, BatchNorm (its statistics not trained), pools."""
    import reference_data

    ref = reference_data.load("lenet")
    X, Y = ref.inputs[:96], ref.one_hot[:96]
    est = OrtGradientOptimizer(add_loss_output(ref.model, "log"), max_iter=2, batch_size=ref.batch_size,
                               shuffle=False, learning_rate=OPTIMIZERS[optimizer]())
    folder = ortflow.export_training_package(est, tmp_path / "pkg")
    est.fit(X, Y)
    assert TrainingPackage(folder).weights == est.weights_to_train_ == ref.parameters
    state = train_package(folder, X, Y, epochs=2, shuffle=False)
    _assert_same_weights(state, est.get_state(), state.steps)
