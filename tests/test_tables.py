"""Mixed-type tables: a scikit-learn Pipeline with a ColumnTransformer (imputer, scaler, one-hot encoder, integer
passthrough) converts with one input per column; both trainers take the DataFrame, feed each input by name, keep the
preprocessing frozen (computed once, out of the trained graph) and train only the estimator's weights."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import ortflow
from ortflow.convert import estimator_record, graph_classes
from ortflow.frozen_prefix import FrozenPrefix
from ortflow.inputs import InputMapping

pd = pytest.importorskip("pandas")
pytest.importorskip("skl2onnx")

from sklearn.compose import ColumnTransformer  # noqa: E402
from sklearn.impute import SimpleImputer  # noqa: E402
from sklearn.linear_model import SGDRegressor  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import OneHotEncoder, StandardScaler  # noqa: E402

TRAINERS = {
    "full": lambda onx, **kw: ortflow.OrtGradientOptimizer(ortflow.add_loss_output(onx, "squared_error"), **kw),
    "fwbw": lambda onx, **kw: ortflow.OrtGradientForwardBackwardOptimizer(onx, learning_loss="squared_error", **kw),
}


def _frame(n=600, seed=0):
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "amount": rng.normal(size=n),
        "city": rng.choice(["paris", "lyon", "nice"], size=n),
        "rooms": rng.integers(0, 5, size=n),
        "age": rng.normal(size=n),
        "garden": rng.random(n) < 0.5,
    })
    y = 2 * frame.amount + 3 * (frame.city == "lyon") + 0.5 * frame.rooms + frame.age + frame.garden
    frame.loc[::7, "age"] = np.nan  # gaps the imputer fills
    return frame, y.to_numpy(dtype=np.float64)


def _preprocessing():
    return ColumnTransformer([
        ("numbers", make_pipeline(SimpleImputer(), StandardScaler()), ["amount", "age"]),
        ("categories", OneHotEncoder(handle_unknown="ignore"), ["city"]),
        ("counts", "passthrough", ["rooms", "garden"]),
    ])


@pytest.fixture(scope="module")
def regression():
    frame, y = _frame()
    # one SGD epoch: an under-trained start, so training has work to do
    pipe = make_pipeline(_preprocessing(), SGDRegressor(max_iter=1, tol=None, random_state=0)).fit(frame, y)
    return frame, y, pipe, ortflow.to_onnx(pipe, frame)


def test_one_typed_input_per_column(regression):
    frame, _, _, onx = regression
    types = {i.name: i.type.tensor_type.elem_type for i in onx.graph.input}
    assert types == {"amount": onnx.TensorProto.FLOAT, "city": onnx.TensorProto.STRING,
                     "rooms": onnx.TensorProto.INT64, "age": onnx.TensorProto.FLOAT,
                     "garden": onnx.TensorProto.INT64}


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_trains_on_a_frame_whatever_the_column_order(regression, trainer):
    frame, y, pipe, onx = regression
    est = TRAINERS[trainer](onx, max_iter=15, learning_rate=0.01, batch_size=32, random_state=0)
    est.fit(frame[frame.columns[::-1]], y)
    assert est.train_losses_[-1] < 0.5 * est.train_losses_[0]
    assert est.score(frame, y) > pipe.score(frame, y)
    assert list(est.feature_names_in_) == list(frame.columns[::-1])
    assert est.n_features_in_ == frame.shape[1]
    shuffled = frame[["rooms", "garden", "age", "city", "amount"]]
    np.testing.assert_array_equal(est.predict(frame), est.predict(shuffled))
    with pytest.raises(ValueError, match=r"missing \['city'\]"):
        est.predict(frame.drop(columns="city"))
    with pytest.raises(ValueError, match=r"unexpected \['extra'\]"):
        est.predict(frame.assign(extra=1.0))


def test_the_preprocessing_stays_frozen_and_out_of_the_trained_graph(regression):
    """Only the estimator's weights train; the trained graph keeps the preprocessing and runs on the raw frame."""
    frame, y, pipe, onx = regression
    est = TRAINERS["full"](onx, max_iter=3, learning_rate=0.01, batch_size=32)
    est.fit(frame, y)
    assert sorted(est.weights_to_train_) == ["coef", "intercept"]
    trained_ops = {n.op_type for n in est._train_model.graph.node}
    assert not trained_ops & {"OneHotEncoder", "Imputer", "Scaler"}
    trained = est.get_trained_onnx()
    assert {i.name for i in trained.graph.input} == set(frame.columns)
    from ortflow._ort import InferenceSession

    sess = InferenceSession(trained.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = est._feeds(frame)
    out = sess.run(None, feeds)[0].ravel()
    np.testing.assert_array_equal(out, est.predict(frame))


def test_gaps_in_a_text_column_are_refused_naming_it(regression):
    frame, y, _, onx = regression
    broken = frame.astype({"city": object})
    broken.loc[3, "city"] = None
    est = TRAINERS["fwbw"](onx, max_iter=1)
    with pytest.raises(ValueError, match=r"column 'city' has a missing value at index \(3,\)"):
        est.fit(broken, y)


def test_a_single_array_for_a_table_graph_is_refused(regression):
    frame, y, _, onx = regression
    with pytest.raises(TypeError, match="pass a pandas DataFrame or a dict"):
        TRAINERS["fwbw"](onx, max_iter=1).fit(np.zeros((10, 5), dtype=np.float32), y[:10])


def test_a_dict_of_columns_feeds_the_same(regression):
    frame, y, _, onx = regression
    est = TRAINERS["fwbw"](onx, max_iter=2, learning_rate=0.01, batch_size=32, random_state=0).fit(frame, y)
    columns = {name: frame[name].to_numpy() for name in frame.columns}
    np.testing.assert_array_equal(est.predict(columns), est.predict(frame))


def test_the_prefix_cut_is_exactly_what_no_trained_weight_reaches(regression):
    frame, _, _, onx = regression
    model = ortflow.make_trainable(onx)
    output = [o.name for o in model.graph.output if o.name == "variable"][0]
    feeds = InputMapping.of(model).feeds(frame)[0]
    part, prefix = FrozenPrefix.split(model, ["coef", "intercept"], list(feeds), [output], feeds)
    assert prefix is not None
    # the trainable part reads the cut (the preprocessed matrix) and starts at the first trained weight's node
    assert [i.name for i in part.graph.input] == prefix.cut
    assert part.graph.node[0].op_type == "MatMul"
    # nothing to cut when the first node already reads a trained weight: the graph is trained whole
    from sklearn.linear_model import LinearRegression

    X = frame[["amount", "rooms"]].to_numpy(dtype=np.float32)
    plain = ortflow.make_trainable(ortflow.to_onnx(LinearRegression().fit(X, X[:, 0]), X))
    x_feeds = InputMapping.of(plain).feeds(X)[0]
    whole, none = FrozenPrefix.split(plain, ["coef", "intercept"], list(x_feeds), [plain.graph.output[0].name],
                                     x_feeds)
    assert none is None and whole.graph.node == plain.graph.node


# -- classifiers: a Pipeline ending in a model ortflow writes gets ortflow's head (raw_score), after skl2onnx's
# preprocessing


def _labels(frame, k):
    score = 2 * frame.amount + 3 * (frame.city == "lyon") - frame.rooms + frame.garden
    edges = np.quantile(score, np.linspace(0, 1, k + 1)[1:-1])
    return np.array(["low", "mid", "high"][:k] if k == 3 else ["no", "yes"])[np.searchsorted(edges, score)]


@pytest.fixture(scope="module", params=[2, 3], ids=["binary", "three"])
def classification(request):
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    frame, _ = _frame()
    y = _labels(frame, request.param)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        # one lbfgs iteration: an under-trained start
        pipe = make_pipeline(_preprocessing(), LogisticRegression(max_iter=1)).fit(frame, y)
    return frame, y, pipe, ortflow.to_onnx(pipe, frame)


def test_a_classifier_pipeline_gets_ortflow_s_head(classification):
    frame, y, pipe, onx = classification
    assert [o.name for o in onx.graph.output] == ["output_label", "output_probability", "raw_score"]
    assert {i.name for i in onx.graph.input} == set(frame.columns)
    assert graph_classes(onx).tolist() == pipe.classes_.tolist()
    assert estimator_record(onx)["class"] == "LogisticRegression"
    from ortflow._ort import InferenceSession

    sess = InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    labels, proba, _ = sess.run(None, InputMapping.of(onx).feeds(frame)[0])
    np.testing.assert_array_equal(labels, pipe.predict(frame))
    np.testing.assert_allclose(proba, pipe.predict_proba(frame), atol=1e-5)


@pytest.mark.parametrize("trainer", ["full", "fwbw"])
def test_a_classifier_pipeline_trains_on_a_frame(classification, trainer):
    frame, y, pipe, onx = classification
    params = dict(max_iter=20, learning_rate=0.05, batch_size=32, random_state=0)
    if trainer == "full":
        est = ortflow.OrtGradientOptimizer(ortflow.add_loss_output(onx, "log"), **params)
    else:
        est = ortflow.OrtGradientForwardBackwardOptimizer(onx, learning_loss="log", **params)
    est.fit(frame, y)
    assert sorted(est.weights_to_train_) == ["coef", "intercept"]
    assert set(est.predict(frame)) <= set(pipe.classes_)
    assert est.predict_proba(frame).shape == (len(frame), len(pipe.classes_))
    assert est.score(frame, y) > pipe.score(frame, y)
    assert est.score(frame, y) > 0.85


def test_a_regressor_pipeline_on_an_array_gets_ortflow_s_weights():
    """The same path for regressors and plain float matrices: ortflow's coef/intercept after skl2onnx's Scaler."""
    from sklearn.linear_model import Ridge

    rng = np.random.default_rng(1)
    X = rng.normal(size=(100, 3)) * [1, 10, 100]
    pipe = make_pipeline(StandardScaler(), Ridge()).fit(X, X @ [1.0, 0.1, 0.01])
    onx = ortflow.to_onnx(pipe, X)
    assert sorted(i.name for i in onx.graph.initializer) == ["coef", "intercept"]
    assert [n.op_type for n in onx.graph.node] == ["Scaler", "MatMul", "Add"]
    from ortflow._ort import InferenceSession

    sess = InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"X": X.astype(np.float32)})[0].ravel(), pipe.predict(X),
                               rtol=1e-4, atol=1e-4)
