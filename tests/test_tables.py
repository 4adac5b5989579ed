"""Mixed-type tables: a scikit-learn Pipeline with a ColumnTransformer (imputer, scaler, one-hot encoder, integer
passthrough) converts with one input per column; both trainers take the DataFrame, feed each input by name, keep the
preprocessing frozen (computed once, out of the trained graph) and train only the estimator's weights."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import ortflow
from ortflow.convert.sklearn import estimator_record, graph_classes
from ortflow.runtime.frozen_prefix import FrozenPrefix
from ortflow.data.inputs import InputMapping

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


# -- dates: fed as int64 days since 1970-01-01, split into parts by ortflow.convert.tables.DateParts (sklearn and ONNX alike)


def _dates():
    """Every day from 1896 to 2104: leap years (1896, 2000, 2104), the non-leap 1900 and 2100, days before 1970."""
    return pd.Series(pd.date_range("1896-01-01", "2104-12-31", freq="D"))


def test_date_parts_are_the_calendar_s():
    from ortflow.convert.tables import DateParts

    d = _dates()
    parts = DateParts().fit_transform(d.to_frame("d"))
    expected = np.stack([d.dt.year, d.dt.month, d.dt.day, d.dt.day_of_week, d.dt.day_of_year], axis=1)
    np.testing.assert_array_equal(parts, expected)
    assert DateParts(parts=("month",)).fit(d.to_frame("d")).get_feature_names_out().tolist() == ["d_month"]


def test_days_since_1970_from_what_users_hold():
    from ortflow.convert.tables import MISSING_DAY, to_days

    assert to_days(np.array(["1970-01-02", "1969-12-31"])).tolist() == [1, -1]
    assert to_days(np.array(["2000-03-01T23:59"], dtype="datetime64[m]")).tolist() == [11017]
    assert to_days(np.array([pd.Timestamp("1970-01-03"), None, np.nan], dtype=object)).tolist() == \
        [2, MISSING_DAY, MISSING_DAY]
    assert to_days(np.array([5, -3])).tolist() == [5, -3]
    # the first days pandas holds at nanoseconds, and a time before midnight (floored), NaT beside them
    ns = np.array(["1677-09-22", "1969-12-31T23:00", "NaT", "2262-04-11"], dtype="datetime64[ns]")
    assert to_days(ns).tolist() == [-106751, -1, MISSING_DAY, 106751]


def test_date_parts_in_onnx_equal_sklearn_s_transform():
    from ortflow._ort import InferenceSession
    from ortflow.convert.sklearn import table_input_types
    from ortflow.convert.tables import DateParts, register_converters
    from skl2onnx import to_onnx as skl_to_onnx

    register_converters()
    d = _dates()
    frame = pd.DataFrame({"d": d, "e": d.sample(frac=1, random_state=0).reset_index(drop=True)})
    frame.loc[::5, "e"] = pd.NaT  # missing dates: NaN parts
    ct = ColumnTransformer([("dates", DateParts(), ["d", "e"])]).fit(frame)
    onx = skl_to_onnx(ct, initial_types=table_input_types(frame), target_opset={"": 17, "ai.onnx.ml": 3})
    assert not [i for i in onx.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    feeds = InputMapping(InputMapping.of(onx).inputs, allow_missing=True).feeds(frame)[0]
    assert feeds["d"].dtype == np.int64
    out = InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(out, ct.transform(frame).astype(np.float32))
    assert np.isnan(out[::5, 5:]).all()


def _mixed_frame(n=800, seed=3):
    """Strings, integers, booleans, floats with gaps and dates with gaps: a table as users have it."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "city": rng.choice(["paris", "lyon", "nice", "lille"], size=n),
        "rooms": rng.integers(1, 6, size=n),
        "garden": rng.random(n) < 0.4,
        "area": rng.normal(70, 20, size=n),
        "sold": pd.to_datetime("2015-01-01") + pd.to_timedelta(rng.integers(0, 3000, size=n), unit="D"),
    })
    y = (0.05 * frame.area + 2 * (frame.city == "paris") + frame.rooms + frame.garden
         + 0.5 * (frame.sold.dt.year - 2015) + np.sin(frame.sold.dt.month))
    frame.loc[::9, "area"] = np.nan
    frame.loc[::11, "sold"] = pd.NaT
    return frame, y.to_numpy(dtype=np.float64)


def _mixed_pipeline():
    from sklearn.preprocessing import OrdinalEncoder

    from ortflow.convert.tables import DateParts

    return make_pipeline(ColumnTransformer([
        ("numbers", make_pipeline(SimpleImputer(strategy="median"), StandardScaler()), ["area"]),
        ("city", OneHotEncoder(handle_unknown="ignore"), ["city"]),
        ("rooms", OrdinalEncoder(), ["rooms"]),
        ("garden", "passthrough", ["garden"]),
        ("dates", make_pipeline(DateParts(), SimpleImputer(), StandardScaler()), ["sold"]),
    ]), SGDRegressor(max_iter=1, tol=None, random_state=0))


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_a_table_with_text_integers_booleans_and_dates_trains(trainer):
    frame, y = _mixed_frame()
    pipe = _mixed_pipeline().fit(frame, y)
    onx = ortflow.to_onnx(pipe, frame)
    types = {i.name: i.type.tensor_type.elem_type for i in onx.graph.input}
    assert types["sold"] == onnx.TensorProto.INT64 and types["city"] == onnx.TensorProto.STRING
    est = TRAINERS[trainer](onx, max_iter=10, learning_rate=0.01, batch_size=32, random_state=0).fit(frame, y)
    assert sorted(est.weights_to_train_) == ["coef", "intercept"]
    assert est.score(frame, y) > max(pipe.score(frame, y), 0.8)
    shuffled = frame[["sold", "garden", "area", "city", "rooms"]]
    np.testing.assert_array_equal(est.predict(frame), est.predict(shuffled))
    with pytest.raises(ValueError, match=r"missing \['sold'\]"):
        est.predict(frame.drop(columns="sold"))


def test_a_missing_date_is_refused_where_the_graph_does_not_impute():
    from ortflow.data.inputs import DataInput

    mapping = InputMapping([DataInput("sold", onnx.TensorProto.INT64, (1,)), DataInput("x", 1, (1,))])
    frame = pd.DataFrame({"sold": pd.to_datetime(["2020-01-01", None]), "x": [1.0, 2.0]})
    with pytest.raises(ValueError, match=r"column 'sold' has a missing date at index \(1,\)"):
        mapping.feeds(frame)
    assert mapping.feeds(frame.iloc[:1])[0]["sold"].tolist() == [[18262]]


def test_the_trained_graph_keeps_the_estimator_it_came_from(regression):
    frame, y, _, onx = regression
    est = TRAINERS["fwbw"](onx, max_iter=1, batch_size=32).fit(frame, y)
    from ortflow.convert.sklearn import estimator_record

    assert estimator_record(est.get_trained_onnx())["class"] == "SGDRegressor"



# --- probe round 3 (docs/RELIABILITY.md): what a user's table may hold -------------------------------------------
def _city_pipeline(encoder, frame, y):
    from sklearn.linear_model import SGDRegressor

    ct = ColumnTransformer([("n", StandardScaler(), ["amount"]), ("c", encoder, ["city"])])
    return ortflow.to_onnx(make_pipeline(ct, SGDRegressor(max_iter=1, tol=None)).fit(frame, y), frame)


def test_a_category_unseen_in_training_is_named_or_encoded_as_zeros():
    frame, y = _frame()
    frame = frame[["amount", "city"]]
    later = frame.assign(city=frame.city.where(frame.index > 2, "marseille"))
    strict = TRAINERS["fwbw"](_city_pipeline(OneHotEncoder(), frame, y), max_iter=1).fit(frame, y)
    with pytest.raises(ValueError, match=r"column 'city' holds 1 value\(s\) its one-hot encoder did not see in "
                                         r"training, \['marseille'\].*handle_unknown='ignore'"):
        strict.predict(later)
    lenient = TRAINERS["fwbw"](_city_pipeline(OneHotEncoder(handle_unknown="ignore"), frame, y),
                               max_iter=1).fit(frame, y)
    assert np.isfinite(lenient.predict(later)).all()


def test_a_column_of_gaps_only_is_named_at_conversion():
    from sklearn.linear_model import SGDRegressor

    frame, y = _frame()
    frame = frame[["amount"]].assign(empty=np.nan)
    pipe = make_pipeline(ColumnTransformer([("n", make_pipeline(SimpleImputer(), StandardScaler()),
                                             ["amount", "empty"])]), SGDRegressor(max_iter=1)).fit(frame, y)
    with pytest.raises(ValueError, match=r"column\(s\) \['empty'\] hold no value .*keep_empty_features=True"):
        ortflow.to_onnx(pipe, frame)


def test_a_date_given_as_text_says_to_parse_it():
    from sklearn.linear_model import SGDRegressor

    from ortflow.convert.tables import DateParts

    frame, y = _frame()
    frame = frame[["amount"]].assign(day=pd.date_range("2020-01-01", periods=len(frame)))
    ct = ColumnTransformer([("n", StandardScaler(), ["amount"]),
                            ("d", make_pipeline(DateParts(), StandardScaler()), ["day"])])
    onx = ortflow.to_onnx(make_pipeline(ct, SGDRegressor(max_iter=1)).fit(frame, y), frame)
    est = TRAINERS["fwbw"](onx, max_iter=1).fit(frame, y)
    text = frame.assign(day=frame.day.dt.strftime("%d/%m/%Y"))
    with pytest.raises(TypeError, match=r"column 'day' holds values that are not integers .*pandas.to_datetime"):
        est.predict(text)


def test_a_preprocessing_too_large_for_memory_is_refused_before_any_work(monkeypatch):
    """A one-hot encoder of very many levels writes that many dense columns per row: the frozen prefix refuses
    rows that would take more than half the memory available, naming the width (here the memory is made small)."""
    import ortflow.runtime.frozen_prefix as fp

    frame, y = _frame()
    frame = frame[["amount", "city"]]
    onx = _city_pipeline(OneHotEncoder(handle_unknown="ignore"), frame, y)
    monkeypatch.setattr(fp, "_available_bytes", lambda: 2 * 1000.0)
    with pytest.raises(MemoryError, match=r"turns 600 rows into \{'.*': 4\} values per row.*max_categories"):
        TRAINERS["fwbw"](onx, max_iter=1).fit(frame, y)
