"""``data=parquet``: a folder of Parquet files streamed through the chain (pipelines/data/streams.py).

The folder (4 files x 3 row groups, written here) is never read whole by the stages; the tests read it whole to
check them: the test metrics equal those of the same rows scored in memory by the trained model, the three-band
split is stable and disjoint, the lineage is logged from the files' metadata, a bad column is named before any
run, and a streamed training stopped inside an epoch and resumed from its logged mid-epoch checkpoint ends
with the uninterrupted weights. The module's chain takes the default path (``preprocess=auto``: the scaling fitted on
the training sample, in the graph), as does a table with text, booleans, dates and gaps; gaps are refused on the
numbers-only path (``preprocess=none``: standardized outside the graph).
"""

import functools
import json
from pathlib import Path

import mlflow
import numpy as np
import onnx
import onnxruntime
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient
from onnx import numpy_helper

import ortflow
from ortflow.data.sources import _position_fractions, _stable_fraction
from pipelines.base.errors import DataError
from pipelines.data.datasets import Split
from pipelines.data.streams import open_stream
from pipelines.execution.bundle import Bundle
from pipelines.execution.runner import execute_stage, prepare
from pipelines.modeling.metrics import regression_metrics
from pipelines.modeling.predictions import session_feeds
from pipelines.stages.train import train
from tolerances import U32, float32_sum_atol

FILES, GROUPS, GROUP_ROWS = 4, 3, 100
N = FILES * GROUPS * GROUP_ROWS
WEIGHTS = np.array([2.0, -0.3, 4.0])
TEST, VALIDATION_FRACTION = 0.2, 0.2
VALID = VALIDATION_FRACTION * (1 - TEST)  # validation_fraction: a share of the rows outside the test part


def _table(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, 3)) * [1.0, 10.0, 0.1] + [0.0, 5.0, 1.0]  # features of different scales
    y = X @ WEIGHTS + 1.0 + rng.normal(scale=0.1, size=N)
    return pd.DataFrame({"id": np.arange(N), "a": X[:, 0], "b": X[:, 1], "c": X[:, 2].astype(np.float32),
                         "y": y})


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """``(folder, the whole table)``: the folder holds FILES files of GROUPS row groups each."""
    folder = tmp_path_factory.mktemp("parquet") / "events"
    folder.mkdir()
    frame = _table()
    for k, rows in enumerate(np.array_split(np.arange(N), FILES)):
        pq.write_table(pa.Table.from_pandas(frame.iloc[rows], preserve_index=False),
                       folder / f"part-{k}.parquet", row_group_size=GROUP_ROWS)
    return folder, frame


def _overrides(folder, uri, root, *more):
    return ["data=parquet", f"data.path={folder}", "data.target=y", "data.key=id", f"mlflow.tracking_uri={uri}",
            f"mlflow.root={root}", "trainer.max_iter=4", "trainer.batch_size=16", "data.sample_rows=200",
            "data.buffer_rows=250", *more]


def _band(frame: pd.DataFrame, low: float, high: float) -> pd.DataFrame:
    fraction = _stable_fraction(frame["id"].to_numpy())
    return frame[(fraction >= low) & (fraction < high)]


@pytest.fixture(scope="module")
def chain(table, tmp_path_factory, new_sqlite_store, run_chain_clean):
    """The whole chain on the folder, in a sqlite store of its own: ``(result, uri)``."""
    folder, _ = table
    root = tmp_path_factory.mktemp("chain")
    uri = new_sqlite_store(root / "mlflow.db")
    return run_chain_clean(_overrides(folder, uri, root), root / "work"), uri


def test_streamed_test_metrics_equal_the_in_memory_ones(chain, table):
    result, uri = chain
    _, frame = table
    evaluate = result.stage_run_ids["evaluate"]
    logged = MlflowClient(uri).get_run(evaluate).data.metrics
    test = _band(frame, 0.0, TEST)
    assert logged["n_test"] == len(test)
    path = mlflow.artifacts.download_artifacts(run_id=evaluate, artifact_path="graphs/deploy_model.onnx",
                                               tracking_uri=uri)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["a", "b", "c"]  # the raw columns: the scaling is in the graph

    def predict(X):
        frame = pd.DataFrame(np.asarray(X, dtype=np.float64), columns=["a", "b", "c"])
        return session.run(None, session_feeds(session, frame))[0].reshape(len(X), -1)[:, 0]

    X, y = test[["a", "b", "c"]].to_numpy(np.float64), test["y"].to_numpy()
    predicted = predict(X)
    expected = regression_metrics(y, predicted)
    # the deploy graph is affine (the scaling, then the linear model): its weights and intercept from unit rows; a
    # prediction is a float32 sum of n_features + 1 terms, the same rows scored in batches of another size may
    # differ by float32_sum_atol of them
    intercept = float(predict(np.zeros((1, 3)))[0])
    weights = predict(np.eye(3)) - intercept
    tolerance = float32_sum_atol(np.abs(X.astype(np.float32)) @ np.abs(weights) + abs(intercept), 4)
    error = np.abs(y - predicted)
    atol = {"test_mse": float(np.mean(2 * error * tolerance + tolerance ** 2)),
            "test_mae": float(np.mean(tolerance))}
    atol["test_r2"] = atol["test_mse"] / float(np.var(y))
    for key, value in expected.items():
        assert abs(logged[key] - value) <= atol[key] + 1e-9 * abs(value), (key, logged[key], value)
    assert logged["test_r2"] > 0.99  # it learned the linear target
    for key in ("sklearn_test_mse", "start_test_r2"):  # the baselines, streamed in convert
        assert np.isfinite(logged[key])


def test_the_three_parts_are_stable_disjoint_and_covering(chain, table, compose_pipeline):
    result, _ = chain
    folder, frame = table
    cfg = compose_pipeline("data=parquet", f"data.path={folder}", "data.target=y", "data.key=id")
    ids = {}
    for attempt in range(2):  # two opens of the folder: the same rows in each part
        _, parts = open_stream(cfg.data)
        for part, source in parts.items():
            keyed = type(source)(source.path, "id", [], _held=source._held)  # the key as target: the rows' ids
            found = np.concatenate([y for _, y, _ in keyed.chunks(None)])
            assert ids.setdefault(part, found).tolist() == found.tolist(), part
    assert sorted(ids) == ["test", "train", "validation"]
    every = np.concatenate(list(ids.values()))
    assert len(every) == len(set(every.tolist())) == N  # disjoint and covering
    for part, (low, high) in {"test": (0, TEST), "validation": (TEST, TEST + VALID), "train": (TEST + VALID, 1)
                              }.items():
        assert sorted(ids[part].tolist()) == sorted(_band(frame, low, high)["id"].tolist()), part
    # the split the chain saved describes these parts; the saved samples are their first rows
    split = Split.load(Bundle.from_source(
        compose_pipeline(f"source.run_id={result.stage_run_ids['convert']}",
                         f"mlflow.tracking_uri={chain[1]}").source).path("split", "train"))
    assert split.streamed and json.loads(split.stream)["key"] == "id"
    first_test = _band(frame, 0.0, TEST)["y"].to_numpy()[:len(split.y_test)]
    # the sample is standardized in float32 and scaled back: a few float32 roundings of the target's magnitude
    np.testing.assert_allclose(split.raw_y(split.y_test), first_test, atol=8 * U32 * np.abs(first_test).max())


def test_lineage_from_the_files_metadata(chain, table):
    result, uri = chain
    folder, _ = table
    client = MlflowClient(uri)
    tags = client.get_run(result.stage_run_ids["convert"]).data.tags
    assert tags["ortflow.data.source"] == str(folder.resolve())
    assert tags["ortflow.data.rows"] == str(N) and tags["ortflow.data.files"] == str(FILES)
    assert len(tags["ortflow.data.digest"]) == 16 and "column 'id'" in tags["ortflow.data.split"]
    for stage, contexts in (("train", {"training", "validation"}), ("evaluate", {"testing"})):
        inputs = client.get_run(result.stage_run_ids[stage]).inputs.dataset_inputs
        found = {i.tags[0].value: i.dataset for i in inputs}
        assert set(found) == contexts, stage
        for dataset in found.values():
            assert json.loads(dataset.profile)["table_rows"] == N
            assert json.loads(dataset.source)["uri"].endswith("events")
            assert "'a'" in dataset.schema or '"a"' in dataset.schema


@pytest.mark.parametrize("files", [1, 4])
def test_a_table_without_a_key_splits_its_rows_as_the_fractions_say(files, tmp_path, compose_pipeline, capsys):
    """Seen: one Parquet file without ``data.key`` could not run (``holds no Parquet data for this part of the
    split ... set data.key``), and a folder of 4 files gave a 25/25/50 split silently (whole files went to a part
    by the hash of their names). Rows are split by a stable hash of their position: one file or four split as the
    fractions say, the same rows on every open, and the split is printed before the chain runs."""
    from pipelines.cli import check_inputs

    frame = _table()
    folder = tmp_path / "table"
    folder.mkdir()
    for k, rows in enumerate(np.array_split(np.arange(N), files)):
        pq.write_table(pa.Table.from_pandas(frame.iloc[rows], preserve_index=False), folder / f"part-{k}.parquet",
                       row_group_size=GROUP_ROWS)
    path = folder / "part-0.parquet" if files == 1 else folder
    cfg = compose_pipeline("data=parquet", f"data.path={path}", "data.target=y", f"data.test_size={TEST}",
                           f"data.validation_fraction={VALIDATION_FRACTION}")
    ids = {}
    for attempt in range(2):
        _, parts = open_stream(cfg.data)
        for part, source in parts.items():
            keyed = type(source)(source.path, "id", [], _held=source._held, files=source.files)
            found = np.concatenate([y for _, y, _ in keyed.chunks(None)])
            assert ids.setdefault(part, found).tolist() == found.tolist(), part
            assert source.n_rows == len(found), part  # known from the files' metadata, before reading
    every = np.concatenate(list(ids.values()))
    assert len(every) == len(set(every.tolist())) == N  # disjoint and covering
    # each part's share within 4 binomial standard deviations of its fraction (1200 rows: 0.2 +- 0.046)
    for part, fraction in {"test": TEST, "validation": VALID, "train": 1 - TEST - VALID}.items():
        assert abs(len(ids[part]) / N - fraction) < 4 * np.sqrt(fraction * (1 - fraction) / N), (part, len(ids[part]))
    check_inputs(cfg, ["convert"])
    printed = capsys.readouterr().out
    rows = {p: len(v) for p, v in ids.items()}
    assert (f"split of {path.resolve()}: {rows['train']} training, {rows['validation']} validation, {rows['test']} "
            "test rows (a stable hash of each row's position") in printed


@pytest.mark.parametrize("override,words", [
    ("data.target=price", ["data.target='price'", "'a'", "'id'"]),
    ("data.key=user", ["data.key='user'"]),
    ("data.features=[a,zz]", ["zz"]),
])
def test_a_bad_column_is_named(table, compose_pipeline, override, words):
    folder, _ = table
    cfg = compose_pipeline("data=parquet", f"data.path={folder}", "data.target=y", "data.key=id", override)
    with pytest.raises(DataError) as info:
        open_stream(cfg.data)
    for word in words:
        assert word in str(info.value)


def test_a_parquet_error_names_what_is_wrong_and_points_to_the_streams_section(table, tmp_path, compose_pipeline):
    """Seen: ``data.features`` holding the split key was refused as ``includes the target or the split key: ['y',
    'id']`` (the target was not in it), and the split's errors pointed to 'Your own data' and suggested
    ``data.drop_invalid``, which streams do not read."""
    import io

    from pipelines.base.errors import report

    folder, frame = table
    cfg = compose_pipeline("data=parquet", f"data.path={folder}", "data.target=y", "data.key=id",
                           "data.features=[a,id]")
    with pytest.raises(DataError) as info:
        open_stream(cfg.data)
    assert "includes the split key 'id'" in str(info.value) and "target" not in str(info.value)
    pq.write_table(pa.Table.from_pandas(frame.head(50).assign(id=lambda f: f.id.where(f.index != 7)),
                                        preserve_index=False), tmp_path / "nulls.parquet")
    cfg = compose_pipeline("data=parquet", f"data.path={tmp_path / 'nulls.parquet'}", "data.target=y", "data.key=id")
    with pytest.raises(DataError, match="the split key 'id' is missing in 1 row") as info:
        open_stream(cfg.data)
    printed = io.StringIO()
    report(info.value, printed)
    assert "hint: see 'Parquet larger than memory' in docs/PIPELINES.md (data.test_size" in printed.getvalue()
    assert "drop_invalid" not in printed.getvalue() and "Your own data" not in printed.getvalue()


@pytest.mark.parametrize("key", [None, "id"])
def test_an_empty_folder_or_a_missing_column_is_said_as_it_is(key, table, tmp_path, compose_pipeline):
    """Seen: an empty folder gave ``data.target='y' is not a column of ...; its columns: []``; the error of a
    missing column suggested ``data.key`` when it was set."""
    import io

    from pipelines.base.errors import report

    folder, _ = table
    (tmp_path / "empty").mkdir()
    cfg = compose_pipeline("data=parquet", f"data.path={tmp_path / 'empty'}", "data.target=y")
    with pytest.raises(DataError, match=r"the folder .*empty holds no Parquet file") as info:
        open_stream(cfg.data)
    assert "its columns" not in str(info.value)
    cfg = compose_pipeline("data=parquet", f"data.path={folder}", "data.target=price",
                           *([f"data.key={key}"] if key else []))
    with pytest.raises(DataError, match="data.target='price' is not a column of") as info:
        open_stream(cfg.data)
    printed = io.StringIO()
    report(info.value, printed)
    hint = printed.getvalue().split("hint:")[1]
    assert ("data.key" in hint) == (key is None), hint


def test_a_column_the_preprocessing_cannot_take_is_named(tmp_path, compose_pipeline):
    """Without preprocessing a text column is refused, pointing at preprocess=auto; with it, text passes and a
    column of lists (no kind of the preprocessing) is refused by name, pointing at how to leave it out."""
    frame = _table().head(50).assign(city="Lyon", tags=[[1, 2]] * 50)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / "t.parquet")
    cfg = compose_pipeline("data=parquet", f"data.path={tmp_path / 't.parquet'}", "data.target=y",
                           "preprocess=none")
    with pytest.raises(DataError, match=r"non-numeric columns \['city', 'tags'\]: preprocess=auto"):
        open_stream(cfg.data, cfg.preprocess)
    cfg = compose_pipeline("data=parquet", f"data.path={tmp_path / 't.parquet'}", "data.target=y")
    with pytest.raises(DataError, match=r"\['tags \(list<element: int64>\)'\]: leave them out"):
        open_stream(cfg.data, cfg.preprocess)
    cfg = compose_pipeline("data=parquet", f"data.path={tmp_path / 't.parquet'}", "data.target=y", "data.key=id",
                           "+preprocess.columns.tags=drop")
    stream, _ = open_stream(cfg.data, cfg.preprocess)
    assert "city" in stream.columns and "tags" not in stream.columns


@pytest.mark.parametrize("where,stage,column,preprocess", [
    ("sample", None, "b", "none"), ("training", "train", "b", "none"), ("test", "convert", "b", "none"),
    ("training", "train", "y", "auto"),  # the graph imputes a feature's gaps, not the target's
])
def test_a_gap_in_the_table_is_named_before_it_trains_or_scores(where, stage, column, preprocess, tmp_path,
                                                                new_sqlite_store, run_chain_clean):
    """Seen with numbers fed as they are (``preprocess=none``): one NaN in a training row past the sample ended the
    chain with a traceback, ``X holds NaN or infinite values (first at index (21552, 2))`` (a chunk's index, no
    column, no file); a gap in the test part would have made the test metrics NaN. Each part's chunks are checked
    as they are read: a DataError names the column (or the target) and the part; a gap in the sample stops the
    chain's check before any run, a later one fails the stage's run."""
    frame = _table()
    fraction = _stable_fraction(frame["id"].to_numpy())
    rows = {"sample": np.flatnonzero(fraction >= TEST + VALID)[0],  # the training part's first row: in the sample
            "training": np.flatnonzero(fraction >= TEST + VALID)[-1],  # its last: past the 200-row sample
            "test": np.flatnonzero(fraction < TEST)[-1]}
    frame.loc[rows[where], column] = np.nan
    folder = tmp_path / "gaps"
    folder.mkdir()
    for k, part in enumerate(np.array_split(np.arange(N), FILES)):
        pq.write_table(pa.Table.from_pandas(frame.iloc[part], preserve_index=False), folder / f"part-{k}.parquet",
                       row_group_size=GROUP_ROWS)
    uri = new_sqlite_store(tmp_path / "mlflow.db")
    expected = (rf"column\(s\) \['b'\] hold missing or non-finite values \(in the {where} rows\).*fill or drop the gaps"
                if column == "b" else rf"the target 'y' holds missing or non-finite values \(in the {where} rows\)")
    with pytest.raises(DataError, match=expected):
        run_chain_clean(_overrides(folder, uri, tmp_path, "trainer.max_iter=1", f"preprocess={preprocess}"),
                        tmp_path / "work")
    experiment = MlflowClient(uri).get_experiment_by_name("ortflow")
    runs = MlflowClient(uri).search_runs([experiment.experiment_id]) if experiment else []
    stages = {r.data.tags["ortflow.stage"]: r.info.status for r in runs if "ortflow.stage" in r.data.tags}
    assert stages == {} if stage is None else stages[stage] == "FAILED", stages


def _weights(uri, run_id):
    path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="graphs/trained_model.onnx",
                                               tracking_uri=uri)
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


class _StopInside(ortflow.Callback):
    """Stops training (as a crash would) at the end of chunk ``chunks`` of epoch ``epoch``: inside the epoch, after
    the mid-epoch checkpoints of the chunks before it were written and logged."""

    def __init__(self, epoch: int, chunks: int):
        self.epoch, self.chunks = epoch, chunks

    def on_chunk_end(self, trainer, position):
        if (position.epoch, position.chunks) == (self.epoch, self.chunks):
            raise RuntimeError(f"stopped inside epoch {position.epoch} after {position.rows} rows")


def test_a_streamed_training_stopped_inside_an_epoch_and_resumed_ends_with_the_uninterrupted_weights(
        chain, table, compose_pipeline, clean_mlflow_env, tmp_path):
    result, uri = chain
    folder, _ = table
    base = [*_overrides(folder, uri, tmp_path, "trainer.optimizer=adam", "trainer.learning_rate=0.05",
                        "trainer.max_iter=5"),
            f"source.run_id={result.stage_run_ids['add_loss']}", "mlflow.experiment_name=parquet-resume"]

    def train_run(work, *more, callbacks=()):
        cfg = compose_pipeline(*base, *more)
        return execute_stage("train", functools.partial(train, callbacks=callbacks), cfg, prepare(cfg),
                             Bundle.from_source(cfg.source), tmp_path / work)["run_id"]

    client = MlflowClient(uri)
    with pytest.raises(RuntimeError, match="stopped inside epoch 3"):
        train_run("stopped", "trainer.checkpoint_every=1", "trainer.checkpoint_every_rows=100",
                  callbacks=[_StopInside(epoch=3, chunks=4)])
    [stopped] = [r.info.run_id for r in client.search_runs(
        [client.get_experiment_by_name("parquet-resume").experiment_id], "attributes.status = 'FAILED'")]
    position = json.loads(Path(mlflow.artifacts.download_artifacts(
        run_id=stopped, artifact_path="checkpoint/trainer.json", tracking_uri=uri)).read_text())
    assert position["epoch"] == 2 and 0 < position["position"]["rows"]  # inside epoch 3, after one of its units
    assert position["position"]["chunks"] < 4

    resumed = train_run("resumed", f"trainer.resume_from={stopped}")
    reference = train_run("reference")
    assert client.get_run(resumed).data.tags["ortflow.resumed_from_epoch"] == "2"
    assert client.get_run(resumed).data.metrics["n_epochs"] == 5
    expected, got = _weights(uri, reference), _weights(uri, resumed)
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():  # the same batches in the same order from the same state: bit for bit
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    losses = {run: [m.value for m in sorted(client.get_metric_history(run, "train_loss"), key=lambda m: m.step)]
              for run in (resumed, reference)}
    assert losses[resumed] == losses[reference]


def test_a_streamed_classifier_scores_its_test_part_as_in_memory(tmp_path, new_sqlite_store, run_chain_clean):
    """Text labels, split by the rows' positions (no key), the features through the default preprocessing (in the graph):
    the classes come from a scan of the training part's target, the metrics of the whole test part (its files)
    equal those of the same rows in memory."""
    from pipelines.modeling.metrics import classification_metrics

    folder = tmp_path / "labels"
    folder.mkdir()
    frame = _table(1).assign(y=lambda f: np.where(f.a - 0.1 * f.b + 0.5 > 0, "yes", "no"))
    for k, rows in enumerate(np.array_split(np.arange(N), 12)):
        pq.write_table(pa.Table.from_pandas(frame.iloc[rows], preserve_index=False),
                       folder / f"part-{k:02d}.parquet", row_group_size=50)
    uri = new_sqlite_store(tmp_path / "mlflow.db")
    result = run_chain_clean(["data=parquet", f"data.path={folder}", "data.target=y", "data.task=classification",
                              "data.features=[a,b,c]", f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path}",
                              "trainer.max_iter=3", "stages=[convert,add_loss,train,evaluate]"], tmp_path / "work")
    evaluate = result.stage_run_ids["evaluate"]
    logged = MlflowClient(uri).get_run(evaluate).data.metrics
    split = Split.load(tmp_path / "work" / "convert" / "split.npz")
    test_size = json.loads(split.stream)["test_size"]
    test = pd.concat([table[_position_fractions(str(file), 0, len(table)) < test_size] for file, table in
                      ((f, pq.read_table(f).to_pandas()) for f in sorted(folder.iterdir()))])
    assert 0 < len(test) < N
    assert logged["n_test"] == len(test) and list(split.classes) == ["no", "yes"]
    path = mlflow.artifacts.download_artifacts(run_id=evaluate, artifact_path="graphs/deploy_model.onnx",
                                               tracking_uri=uri)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["a", "b", "c"]  # the raw columns: the scaling is in the graph
    proba = session.run(["output_probability"], session_feeds(session, test[["a", "b", "c"]]))[0]
    expected = classification_metrics(test["y"].to_numpy().astype(str), proba, split.classes, per_class=True)
    for key, value in expected.items():  # the same probabilities, scored once: equal but for summation order
        assert logged[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key


def _shop(n: int = 1200, seed: int = 3) -> pd.DataFrame:
    """Sales with a number (one gap), text with gaps, a boolean and a date: the target depends on each of them."""
    rng = np.random.default_rng(seed)
    city = rng.choice(np.array(["paris", "lyon", "nice", None], dtype=object), size=n)
    day = pd.Timestamp("2025-01-01") + pd.to_timedelta(rng.integers(0, 365, n), unit="D")
    frame = pd.DataFrame({"id": np.arange(n), "price": rng.normal(10.0, 3.0, n), "city": city,
                          "member": rng.random(n) > 0.5, "day": day})
    effect = pd.Series(city).map({"paris": 2.0, "lyon": -1.0, "nice": 0.0}).fillna(0.5).to_numpy()
    frame["y"] = (0.5 * frame["price"] + effect + 1.5 * frame["member"] + 0.3 * frame["day"].dt.month
                  + rng.normal(scale=0.05, size=n))
    frame.loc[7, "price"] = np.nan  # a gap: the graph's imputer fills it
    return frame


def test_a_table_with_text_booleans_dates_and_gaps_streams_through_the_preprocessing(tmp_path, new_sqlite_store,
                                                                                     run_chain_clean):
    """``preprocess=auto`` (the default) on a streamed table: the preprocessing is fitted on the training sample
    and frozen in the graph, every part streams as raw columns, and the registered model takes the raw rows. Its
    predictions on the test rows read whole (one chunk in evaluate too: the same batch) give the logged metrics."""
    from pipelines.modeling.metrics import regression_metrics

    frame = _shop()
    folder = tmp_path / "shop"
    folder.mkdir()
    for k, rows in enumerate(np.array_split(np.arange(len(frame)), 3)):
        pq.write_table(pa.Table.from_pandas(frame.iloc[rows], preserve_index=False), folder / f"p{k}.parquet",
                       row_group_size=100)
    uri = new_sqlite_store(tmp_path / "mlflow.db")
    result = run_chain_clean(["data=parquet", f"data.path={folder}", "data.target=y", "data.key=id",
                              f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path}", "trainer.max_iter=30",
                              "data.sample_rows=300", "data.buffer_rows=100000"], tmp_path / "work")
    split = Split.load(tmp_path / "work" / "convert" / "split.npz")
    assert split.column_kinds() == {"price": "number", "city": "text", "member": "bool", "day": "date"}
    logged = MlflowClient(uri).get_run(result.stage_run_ids["evaluate"]).data.metrics
    test = _band(frame, 0.0, TEST)
    assert logged["n_test"] == len(test)
    assert logged["test_r2"] > 0.99  # the text, the boolean and the date's month carry the target too
    mlflow.set_tracking_uri(uri)
    served = mlflow.pyfunc.load_model(f"models:/{result.metrics['registered_model']}/1")
    predicted = np.asarray(served.predict(test[["price", "city", "member", "day"]])).reshape(-1)
    for key, value in regression_metrics(test["y"].to_numpy(), predicted).items():
        # the same rows in one batch through the same graph: equal predictions, metrics summed in another order
        assert logged[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


@pytest.mark.slow
def test_the_command_names_a_bad_target_before_any_run(table, tmp_path, pipeline_subprocess_env):
    import subprocess
    import sys

    folder, _ = table
    proc = subprocess.run([sys.executable, "-m", "pipelines.main", "data=parquet", f"data.path={folder}",
                           "data.target=price"], cwd=tmp_path, env=pipeline_subprocess_env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("ortflow: error: DataError: data.target='price' is not a column of")
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("kinds,expected", [
    (None, r"column\(s\) \['label \(the target\)'\] hold missing"),
    ({"a": "number"}, r"the target 'label' holds missing or non-finite values \(in the training rows\)"),
])
def test_a_missing_label_is_named_on_both_paths(kinds, expected):
    """A text label read as None (a null in the file) would otherwise become the class 'None'."""
    from types import SimpleNamespace

    from pipelines.data.streams import raw_rows

    source = SimpleNamespace(path="labels.parquet", target="label", columns=["a"])
    X = pd.DataFrame({"a": [1.0, 2.0, 3.0]})
    with pytest.raises(DataError, match=expected):
        raw_rows(source, X, np.array(["yes", None, "no"], dtype=object), "training", kinds)
    X_out, y_out = raw_rows(source, X, np.array(["yes", "no", "no"], dtype=object), "training", kinds)
    assert list(y_out) == ["yes", "no", "no"] and len(X_out) == 3
