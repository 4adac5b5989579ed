"""Streamed data: Parquet, Arrow, memory-mapped and iterable sources, the read-ahead thread, and fit on a source
(every row once per epoch, reproducible order, stable split, a resumed run equal to an uninterrupted one)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

import ortflow
from ortflow.data.prefetch import Prefetcher
from ortflow.data.sources import ArrowSource, IterableSource, NumpySource, ParquetSource, ordered

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pd = pytest.importorskip("pandas")

N, D = 2000, 4


def _table(n=N, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)).astype(np.float32)
    y = (X @ np.arange(1, D + 1) + 0.5).astype(np.float32)
    frame = pd.DataFrame(X, columns=[f"x{i}" for i in range(D)]).assign(y=y, id=np.arange(n))
    return frame


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Three Parquet files of 250-row row groups."""
    root = tmp_path_factory.mktemp("parquet")
    frame = _table()
    for k, rows in enumerate(np.array_split(np.arange(len(frame)), 3)):
        part = frame.iloc[rows]
        pq.write_table(pa.Table.from_pandas(part, preserve_index=False), root / f"part{k}.parquet", row_group_size=250)
    return root, frame


def _rows(source, rng):
    return np.concatenate([X["x0"].to_numpy() if hasattr(X, "columns") else np.asarray(X)[:, 0]
                           for X, _, _ in map(ordered, source.chunks(rng))])


def test_every_row_once_per_epoch_in_a_reproducible_order(folder):
    root, frame = folder
    source = ParquetSource(root, target="y", columns=[f"x{i}" for i in range(D)], buffer_rows=500)
    assert source.n_rows == N and len(source.files) == 3
    first = _rows(source, np.random.RandomState(0))
    np.testing.assert_array_equal(np.sort(first), np.sort(frame["x0"].to_numpy()))
    np.testing.assert_array_equal(first, _rows(source, np.random.RandomState(0)))
    assert not np.array_equal(first, _rows(source, np.random.RandomState(1)))
    np.testing.assert_array_equal(_rows(source, None), frame["x0"].to_numpy())  # no rng: file order


def test_a_buffers_matrix_is_reused_only_once_nothing_refers_to_it(folder):
    """Each buffer's feature matrix is written into an earlier buffer's once every chunk, frame and view of it is
    gone: chunks a consumer keeps (all of them here, or views of them) still hold their own rows at the epoch's end,
    and a consumer that lets each chunk go gets the same rows in fewer matrices."""
    root, frame = folder
    features = [f"x{i}" for i in range(D)]
    source = ParquetSource(root, target="y", columns=features, buffer_rows=250)  # a buffer per row group
    kept = [ordered(chunk) for chunk in source.chunks(None)]
    views = [X.to_numpy()[::2] for X, _, _ in source.chunks(None)]
    expected = frame[features].to_numpy(np.float32)
    np.testing.assert_array_equal(np.concatenate([X.to_numpy() for X, _, _ in kept]), expected)
    parts = np.split(expected, np.cumsum([len(X) for X, _, _ in kept])[:-1])
    np.testing.assert_array_equal(np.concatenate(views), np.concatenate([part[::2] for part in parts]))
    arrays = [X.to_numpy() for X, _, _ in kept]
    assert len(arrays) > 3 and not any(np.shares_memory(a, b) for i, a in enumerate(arrays) for b in arrays[i + 1:])
    let_go = []
    for X, _, _ in source.chunks(None):
        let_go.append(X.to_numpy().copy())
        del X
    np.testing.assert_array_equal(np.concatenate(let_go), expected)


def test_the_buffer_mixes_rows_of_several_row_groups(folder):
    root, frame = folder
    group_of = dict(zip(frame["x0"], frame["id"] // 250))
    source = ParquetSource(root, target="y", buffer_rows=1000)
    X, _, _ = ordered(next(source.chunks(np.random.RandomState(0))))
    groups = [group_of[v] for v in X["x0"].to_numpy()[:100]]
    assert len(set(groups)) >= 3  # the first 100 rows come from 4 row groups, interleaved


def test_a_split_by_key_is_stable_disjoint_and_covering(folder):
    root, _ = folder
    source = ParquetSource(root, target="y", buffer_rows=500)
    train, valid = source.split(0.2, key="id")
    train2, valid2 = ParquetSource(root, target="y").split(0.2, key="id")
    rows_t = np.concatenate([y for _, y, _ in train.chunks(None)])
    rows_v = np.concatenate([y for _, y, _ in valid.chunks(None)])
    assert len(rows_t) + len(rows_v) == N and 0.15 * N < len(rows_v) < 0.25 * N
    np.testing.assert_array_equal(rows_v, np.concatenate([y for _, y, _ in valid2.chunks(None)]))
    np.testing.assert_array_equal(rows_t, np.concatenate([y for _, y, _ in train2.chunks(None)]))
    assert not set(rows_t.tolist()) & set(rows_v.tolist())
    assert "id" not in next(train.chunks(None))[0].columns  # the key is not a feature


def test_a_three_way_split_cuts_bands_of_one_hash(folder):
    """split([test, validation]): the first part is the two-way split's held-out part whatever the second
    fraction; the three are disjoint and cover the table; head() of a part gathers rows across row groups."""
    root, _ = folder
    source = ParquetSource(root, target="id", columns=["x0"], buffer_rows=500)  # the ids as the target

    def ids(part):
        return np.concatenate([y for _, y, _ in part.chunks(None)])

    train, test, valid = source.split([0.2, 0.1], key="id")
    parts = {"train": ids(train), "test": ids(test), "valid": ids(valid)}
    every = np.concatenate(list(parts.values()))
    assert len(every) == len(set(every.tolist())) == N
    assert 0.05 * N < len(parts["valid"]) < 0.15 * N
    np.testing.assert_array_equal(parts["test"], ids(source.split(0.2, key="id")[1]))
    np.testing.assert_array_equal(parts["test"], ids(source.split([0.2, 0.3], key="id")[1]))
    _, y, _ = valid.head(400)  # about 25 rows of each 250-row group are in the band: many groups read
    np.testing.assert_array_equal(y, parts["valid"][:len(y)])
    assert 150 < len(y) <= 400
    with pytest.raises(ValueError, match="sum below 1"):
        source.split([0.6, 0.4], key="id")


def test_unknown_columns_are_named(folder):
    root, _ = folder
    with pytest.raises(KeyError, match="target column 'label' is not in"):
        ParquetSource(root, target="label")
    with pytest.raises(KeyError, match=r"columns \['z'\] are not in"):
        ParquetSource(root, target="y", columns=["x0", "z"])


def test_the_prefetcher_raises_the_readers_error_and_stops_its_thread():
    def reader():
        yield 1
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        list(Prefetcher(reader()))

    def endless():
        i = 0
        while True:
            yield i
            i += 1

    ahead = Prefetcher(endless(), depth=3)
    assert [next(ahead) for _ in range(5)] == [0, 1, 2, 3, 4]
    ahead.close()
    assert not ahead.alive
    assert not any(t.name == "ortflow-prefetch" and t.is_alive() for t in threading.enumerate())


@pytest.fixture(scope="module")
def start():
    frame = _table(n=50, seed=5)
    X = frame[[f"x{i}" for i in range(D)]].to_numpy(np.float32)
    return ortflow.to_onnx(LinearRegression().fit(X, np.zeros(len(X))), X)


def _trainer(kind, onx, **kw):
    settings = {"learning_rate": 0.01, "batch_size": 50, "max_iter": 3, "random_state": 0, **kw}
    if kind == "full":
        return ortflow.OrtGradientOptimizer(ortflow.add_loss_output(onx, "squared_error"), **settings)
    return ortflow.OrtGradientForwardBackwardOptimizer(onx, learning_loss="squared_error", **settings)


@pytest.mark.parametrize("kind", ["full", "fwbw"])
def test_fit_on_a_source_equals_fit_in_memory_without_shuffling(folder, start, kind):
    """Unshuffled, a source's epochs are the file's rows in order: the same batches as in memory, the same weights."""
    root, frame = folder
    features = [f"x{i}" for i in range(D)]
    streamed = _trainer(kind, start, shuffle=False).fit(ParquetSource(root, target="y", columns=features,
                                                                      buffer_rows=300))
    in_memory = _trainer(kind, start, shuffle=False).fit(frame[features].to_numpy(np.float32), frame["y"])
    assert len(streamed.history_) == 3
    for name, value in in_memory.get_state().items():
        np.testing.assert_array_equal(streamed.get_state()[name], value)


@pytest.mark.parametrize("kind", ["full", "fwbw"])
def test_a_shuffled_source_trains_its_chunks_rows_in_their_order(folder, start, kind):
    """A shuffled chunk keeps its rows where they are and gives their order; the trainer gathers each batch in that
    order: one epoch equals an unshuffled in-memory fit on the rows ``ordered`` lists (buffers of 350 rows: batches
    that straddle two buffers too)."""
    root, _ = folder
    source = ParquetSource(root, target="y", columns=[f"x{i}" for i in range(D)], buffer_rows=350)
    chunks = [ordered(chunk) for chunk in source.chunks(np.random.RandomState(0))]
    assert all(len(chunk) == 4 for chunk in source.chunks(np.random.RandomState(0)))  # left unpermuted, with an order
    X = np.concatenate([X.to_numpy() for X, _, _ in chunks])
    y = np.concatenate([y for _, y, _ in chunks])
    streamed = _trainer(kind, start, max_iter=1, random_state=0).fit(source)
    in_memory = _trainer(kind, start, max_iter=1, shuffle=False).fit(X, y)
    for name, value in in_memory.get_state().items():
        np.testing.assert_array_equal(streamed.get_state()[name], value)


def test_a_streamed_fit_lets_onnxruntimes_idle_threads_sleep_and_trains_the_same(folder, start):
    """``spinning=None``: idle intra-op threads spin in memory, sleep in a streamed fit (whose reader thread needs
    a core); either way the weights are the same, two threads or not."""
    root, frame = folder
    features = [f"x{i}" for i in range(D)]
    source = ParquetSource(root, target="y", columns=features, buffer_rows=400)

    def spins(est) -> bool:
        try:
            return est._session_options().get_session_config_entry("session.intra_op.allow_spinning") != "0"
        except RuntimeError:  # not set: onnxruntime's default, spinning
            return True

    streamed = _trainer("fwbw", start, n_threads=2).fit(source)
    spinning = _trainer("fwbw", start, n_threads=2, spinning=True).fit(source)
    assert not spins(streamed) and spins(spinning)
    for name, value in spinning.get_state().items():
        np.testing.assert_array_equal(streamed.get_state()[name], value)
    X, y = frame[features].to_numpy(np.float32), frame["y"].to_numpy()
    sleeping = _trainer("fwbw", start, n_threads=2, spinning=False).fit(X, y)
    default = _trainer("fwbw", start, n_threads=2).fit(X, y)
    assert not spins(sleeping) and spins(default)
    for name, value in default.get_state().items():
        np.testing.assert_array_equal(sleeping.get_state()[name], value)


@pytest.mark.parametrize("kind", ["full", "fwbw"])
def test_fit_on_a_shuffled_source_learns_and_validates_on_the_held_out_part(folder, start, kind):
    root, _ = folder
    train, valid = ParquetSource(root, target="y", buffer_rows=600).split(0.2, key="id")
    est = _trainer(kind, start, max_iter=6).fit(train, validation_data=valid)
    assert est.train_losses_[-1] < 0.05 * est.train_losses_[0]
    assert len(est.validation_losses_) == 6 and est.validation_losses_[-1] < est.validation_losses_[0]
    assert list(est.feature_names_in_) == [f"x{i}" for i in range(D)]


def test_a_resumed_streamed_run_ends_with_the_uninterrupted_weights(folder, start, tmp_path):
    """A checkpoint holds an epoch boundary and the random state the source's order derives from: a run stopped
    after 2 epochs and resumed replays epochs 3-4 exactly."""
    root, _ = folder
    source = ParquetSource(root, target="y", columns=[f"x{i}" for i in range(D)], buffer_rows=400)
    whole = _trainer("fwbw", start, max_iter=4).fit(source)
    first = _trainer("fwbw", start, max_iter=2).fit(source)
    first.save_checkpoint(tmp_path / "ckpt")
    resumed = _trainer("fwbw", start, max_iter=4).fit(source, resume_from=tmp_path / "ckpt")
    for name, value in whole.get_state().items():
        np.testing.assert_array_equal(resumed.get_state()[name], value)


def test_numpy_arrow_and_iterable_sources_train_the_same_rows(folder, start, tmp_path):
    _, frame = folder
    features = [f"x{i}" for i in range(D)]
    X, y = frame[features].to_numpy(np.float32), frame["y"].to_numpy(np.float32)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    reference = _trainer("fwbw", start, shuffle=False).fit(X, y).get_state()
    sources = [
        NumpySource(tmp_path / "X.npy", tmp_path / "y.npy", block_rows=300),
        ArrowSource(pa.Table.from_pandas(frame[[*features, "y"]]), target="y", block_rows=300),
        IterableSource(lambda: ((X[i:i + 120], y[i:i + 120]) for i in range(0, N, 120)), n_rows=N),
    ]
    for source in sources:
        state = _trainer("fwbw", start, shuffle=False).fit(source).get_state()
        for name, value in reference.items():
            np.testing.assert_array_equal(state[name], value, err_msg=type(source).__name__)


@pytest.mark.parametrize("kind", ["full", "fwbw"])
def test_a_source_of_mixed_columns_feeds_them_as_an_in_memory_frame_does(tmp_path, kind):
    """Numbers and text in one file: each chunk is a frame of the columns, mapped to the graph's inputs (one per
    column, the one-hot encoding in the graph) as an in-memory DataFrame is: the same weights, unshuffled and
    shuffled (against an in-memory fit on the rows ``ordered`` lists)."""
    from sklearn.compose import ColumnTransformer
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    rng = np.random.default_rng(2)
    frame = pd.DataFrame({"a": rng.normal(size=900).astype(np.float32), "b": rng.normal(size=900).astype(np.float32),
                          "city": rng.choice(["paris", "lyon", "nice"], size=900)})
    frame["y"] = (2 * frame["a"] - frame["b"] + frame["city"].map({"paris": 1.0, "lyon": -1.0, "nice": 0.0})
                  ).astype(np.float32)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / "t.parquet", row_group_size=200)
    X = frame[["a", "b", "city"]]
    preprocessing = ColumnTransformer([("numbers", StandardScaler(), ["a", "b"]), ("text", OneHotEncoder(), ["city"])])
    onx = ortflow.to_onnx(make_pipeline(preprocessing, LinearRegression()).fit(X[:60], np.zeros(60)), X[:1])
    assert [i.name for i in onx.graph.input] == ["a", "b", "city"]
    source = ParquetSource(tmp_path / "t.parquet", target="y", buffer_rows=300)
    streamed = _trainer(kind, onx, shuffle=False).fit(source)
    in_memory = _trainer(kind, onx, shuffle=False).fit(X, frame["y"])
    chunks = [ordered(chunk) for chunk in source.chunks(np.random.RandomState(0))]
    shuffled = _trainer(kind, onx, max_iter=1).fit(source)
    in_order = _trainer(kind, onx, max_iter=1, shuffle=False).fit(
        pd.concat([X for X, _, _ in chunks], ignore_index=True), np.concatenate([y for _, y, _ in chunks]))
    assert list(streamed.feature_names_in_) == ["a", "b", "city"]
    for name, value in in_memory.get_state().items():
        np.testing.assert_array_equal(streamed.get_state()[name], value)
        np.testing.assert_array_equal(shuffled.get_state()[name], in_order.get_state()[name])
    assert streamed.train_losses_[-1] < 0.5 * streamed.train_losses_[0]


def test_a_source_refuses_a_separate_y(folder, start):
    root, _ = folder
    with pytest.raises(ValueError, match="the source holds the target"):
        _trainer("fwbw", start).fit(ParquetSource(root, target="y"), np.zeros(N))
