"""A registered model's training package takes the rows as the user has them and predicts in the target's units
(issue 47, item 2): the pipelines' standardization sits inside its graphs (the manifest's ``preprocess``), and a
table's cells (numbers with gaps, booleans, text with gaps, dates) are converted by the JavaScript library as the
pipelines read them (``preprocess.columns``), so a package exported by the chain trains in Node
(examples/node/train.mjs) and in headless Chromium (examples/browser/index.html) on the raw CSV rows as Python's
reference loop does on them. Python's loop takes a table's cells converted by the served model's own conversion
(pipelines/tracking/serving_model.py's ``table_feeds``), which the library's conversion equals cell for cell.

Tolerances (tests/js_support.py's rule): the weights after ``s`` steps within ``weights_atol``; a prediction moves
by at most ``output_atol`` of what the model's weights multiply (the standardized features, or a table's encoded
ones; standardized target units, times the target's scale in its units); a loss ``c * mean(r^2)`` (``r`` the
standardized residuals, ``c`` the loss's own factor, read from Python's values) moves by at most
``c * (2 * d * sqrt(mean r^2) + d^2)`` for residuals that move by ``d``, plus the rounding of its float32 mean.
"""

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import onnx
import pandas as pd
import pytest
from mlflow import MlflowClient

from bench.portable import PageServer, open_page
from ortflow.graph import editing as g
from ortflow._ort import InferenceSession
from ortflow.package import LOSS_FILE, TrainingPackage, _targets, load_training_state, train_package
from pipelines.data.datasets import Split
from pipelines.execution.bundle import Bundle
from pipelines.import_states import import_states
from pipelines.tracking.serving_model import table_feeds

from js_support import (JS, JS_GROUP, NODE, ROOT, make_package, node, output_atol, require_chromium, require_node,
                        weights_atol)
from tolerances import assert_close, float32_sum_atol

pytestmark = JS_GROUP

EXAMPLE = ROOT / "examples" / "node" / "train.mjs"
FEATURES = ["x1", "x2", "x3"]
EPOCHS, SEED = 2, 3
#: where the examples train: Node (examples/node/train.mjs), headless Chromium (examples/browser/index.html) and its
#: Web Worker (examples/browser/worker.html)
RUNTIMES = ("node", "chromium", "worker")
CHAIN = ["data=file", "data.target=target", "model=linear", "trainer.max_iter=3", "trainer.batch_size=16",
         "promotion.register=always"]


def _numbers(path: Path) -> Path:
    """A small regression table far from standardized (means in the thousands, scales from 1 to 300)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 3)) * [1.0, 20.0, 300.0] + [5.0, -40.0, 2000.0]
    y = X @ [3.0, 0.5, 0.02] + rng.normal(size=90) + 300.0
    pd.DataFrame(X, columns=FEATURES).assign(target=y).to_csv(path, index=False, float_format="%.9g")
    return path


def _mixed(path: Path) -> Path:
    """A small table of every kind of column: numbers with gaps, booleans (a gap too), text with gaps (one quoted, as
    pandas writes a cell holding a comma) and ISO dates (before 1970 too, and a gap)."""
    rng = np.random.default_rng(1)
    n = 48
    frame = pd.DataFrame({
        "area": rng.normal(70, 20, n).round(1),
        "garden": rng.random(n) < 0.4,
        "city": rng.choice(["paris", "lyon", "nice, cote d'azur"], n),
        "sold": (pd.Timestamp("1960-01-01") + pd.to_timedelta(rng.integers(0, 25000, n), unit="D"))
        .strftime("%Y-%m-%d"),
    })
    frame["target"] = (2 * frame.area + 30 * (frame.city == "paris") + 5 * frame.garden + rng.normal(0, 5, n)).round(2)
    frame = frame.astype({"garden": object})
    frame.loc[::7, "area"] = np.nan
    frame.loc[5, "garden"] = None
    frame.loc[::9, "city"] = None
    frame.loc[4, "sold"] = None
    frame.to_csv(path, index=False)
    return path


def _exported(tmp: Path, csv: Path, overrides: list[str], new_sqlite_store, run_chain_clean) -> SimpleNamespace:
    """The chain run on ``csv``: its exported package (downloaded), test split and registered version."""
    uri = new_sqlite_store(tmp / "mlflow.db")
    overrides = [*CHAIN, f"data.path={csv}", f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp}", *overrides]
    result = run_chain_clean(overrides, tmp / "chain")
    export_run = result.stage_run_ids["export"]
    tags = MlflowClient(uri).get_run(export_run).data.tags
    assert tags["ortflow.training_package"] == "training_package", tags["ortflow.training_package"]
    _use_store(uri)
    split = Split.load(Bundle.from_run(export_run).path("split", "test"))
    folder = Path(mlflow.artifacts.download_artifacts(run_id=export_run, artifact_path="training_package",
                                                      dst_path=str(tmp / "package")))
    return SimpleNamespace(uri=uri, csv=csv, overrides=overrides, tags=tags, split=split, folder=folder,
                           package=TrainingPackage(folder), rows=pd.read_csv(csv),
                           model=f"models:/{tags['ortflow.registered_model']}/{tags['ortflow.registered_version']}")


def _use_store(uri: str) -> None:
    """The chain's store as MLflow's (its registry too: the registry URI follows the tracking URI unless set)."""
    mlflow.set_tracking_uri(uri)


@pytest.fixture(scope="module")
def numbers(tmp_path_factory, new_sqlite_store, run_chain_clean):
    """The chain on a table of numbers (preprocess=none: the split's standardization inside the package)."""
    require_node()
    tmp = tmp_path_factory.mktemp("numbers")
    return _exported(tmp, _numbers(tmp / "table.csv"), ["preprocess=none"], new_sqlite_store, run_chain_clean)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory, new_sqlite_store, run_chain_clean):
    """The chain on a table of numbers, booleans, text and dates (preprocess=auto: the package declares its columns)."""
    require_node()
    tmp = tmp_path_factory.mktemp("mixed")
    return _exported(tmp, _mixed(tmp / "table.csv"), ["preprocess=auto"], new_sqlite_store, run_chain_clean)


def _train(runtime: str, folder: Path, csv: Path, tmp: Path):
    """The package trained on the CSV file by the example of ``runtime`` (:data:`RUNTIMES`), ``EPOCHS`` shuffled
    epochs of seed ``SEED``: the trained state and each epoch's logs."""
    if runtime == "node":
        state, model, history = tmp / "node.state", tmp / "node.onnx", tmp / "node.json"
        node(EXAMPLE, folder, csv, "--header", "--epochs", EPOCHS, "--seed", SEED, "--state", state, "--model",
             model, "--history", history)
        trained = load_training_state(folder, state)
        assert model.read_bytes() == trained.trained_onnx_bytes()  # the example's trained graph is the state's
        return trained, json.loads(history.read_text())
    require_chromium()
    with PageServer({"/package/": folder, "/input/": csv.parent}) as server:
        query = (f"package=/package/&data=/input/{csv.name}&header=1&epochs={EPOCHS}&seed={SEED}&shuffle=1"
                 "&autorun=1&post=/state")
        page_file = "worker.html" if runtime == "worker" else "index.html"
        page = open_page(f"{server.url}/examples/browser/{page_file}?{query}", timeout=180)
        posted = server.posted
    return load_training_state(folder, posted), page["epochs"]


def _predict(model: bytes, feeds: dict) -> np.ndarray:
    session = InferenceSession(model, providers=["CPUExecutionProvider"])
    out = session.run(None, feeds)[0]
    return out.reshape(len(out))


def _weighed(model: bytes, feeds: dict) -> np.ndarray:
    """What the model's weights multiply (its MatMul's data operand: the standardized or encoded features)."""
    graph = onnx.load_from_string(model)
    operand = next(n.input[0] for n in graph.graph.node if n.op_type == "MatMul")
    graph.graph.output.append(onnx.helper.make_tensor_value_info(operand, onnx.TensorProto.FLOAT, None))
    session = InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run([operand], feeds)[0]


def _loss(package: TrainingPackage, weights: dict, feeds: dict, y: np.ndarray) -> float:
    """The loss of ``loss.onnx`` (the package's preprocessing inside) with ``weights`` on the raw rows."""
    m = package.record
    model = g.replace_initializers(onnx.load_from_string(package.read(LOSS_FILE)), weights)
    session = InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return float(np.asarray(session.run([m.loss.output], {**feeds, m.loss_model.label: _targets(m, y, len(y))})[0])
                 .mean())


def _loss_atol(loss: float, expected: np.ndarray, y: np.ndarray, split: Split, d: float):
    """The tolerance of a loss near ``loss`` (the loss of the predictions ``expected``) when each prediction moves by
    at most ``d`` standardized units (the module's docstring): a function of the loss compared."""
    r = (expected - y) / split.y_scale
    c = loss / float(np.mean(r.astype(np.float64) ** 2))
    return lambda value: (c * (2 * d * np.sqrt(value / c) + d * d) +
                          float(float32_sum_atol(value * len(y), len(y))) / len(y))


def _check_trained(package: TrainingPackage, split: Split, feeds: dict, y: np.ndarray, trained, epochs: list[dict],
                   python, python_epochs: list[dict]) -> None:
    """The state ``trained`` (and its epochs' logs) against Python's (the rule of the module's docstring) on the raw
    rows ``feeds`` and targets ``y``."""
    assert trained.steps == python.steps > 0
    for name, value in python.weights.items():
        np.testing.assert_allclose(trained.weights[name], value, rtol=0,
                                   atol=weights_atol(python.steps, value), err_msg=name)

    # predictions in the target's units, within the derived tolerance of Python's
    expected = _predict(python.trained_onnx_bytes(), feeds)
    predicted = _predict(trained.trained_onnx_bytes(), feeds)
    d = output_atol(python, _weighed(python.trained_onnx_bytes(), feeds))  # standardized units
    assert_close(predicted, expected, rtol=0.0, atol=d * split.y_scale + float32_sum_atol(
        np.abs(expected) + abs(split.y_mean), 4), err_msg="JavaScript vs Python predictions")
    assert np.abs(predicted - y).mean() < y.std()  # the target's units, not standardized ones

    # the losses: each epoch's, and the trained weights' on all the raw rows (loss.onnx, in Python)
    final = _loss(package, python.weights, feeds, y)
    loss_atol = _loss_atol(final, expected, y, split, d)
    assert abs(_loss(package, trained.weights, feeds, y) - final) <= loss_atol(final)
    assert [e["epoch"] for e in epochs] == [e["epoch"] for e in python_epochs]
    for ours, theirs in zip(epochs, python_epochs):
        assert abs(ours["loss"] - theirs["loss"]) <= loss_atol(theirs["loss"]), (ours, theirs)
    assert python_epochs[-1]["loss"] < 1.0  # the standardized scale: the loss the Python trainer reports


@pytest.mark.parametrize("runtime", RUNTIMES[:2])
def test_a_pipelines_package_trains_in_node_and_chromium_on_the_raw_csv_rows(numbers, runtime, compose_pipeline,
                                                                             clean_mlflow_env, tmp_path):
    chain, split = numbers, numbers.split
    _use_store(chain.uri)
    pre = chain.package.manifest["preprocess"]
    np.testing.assert_array_equal(pre["features"]["mean"], split.x_mean)
    np.testing.assert_array_equal(pre["target"]["mean"], np.float32(split.y_mean))
    assert pre["prediction"] and "standardization" not in chain.package.manifest["metadata"]
    assert pre["columns"] is None

    X, y = chain.rows[FEATURES].to_numpy(np.float32), chain.rows["target"].to_numpy(np.float32)
    feeds = {chain.package.record.data_inputs[0].name: X}

    # the registered version (the deploy graph, raw rows in) and the package's own prediction graph agree
    served = np.asarray(mlflow.pyfunc.load_model(chain.model).predict(chain.rows[FEATURES])["prediction"], np.float64)
    start = _predict(chain.package.initial_state().trained_onnx_bytes(), feeds)
    X_std = (X - split.x_mean) / split.x_scale
    atol = float32_sum_atol(np.abs(start) + abs(split.y_mean) + split.y_scale * np.abs(X_std).sum(axis=1),
                            len(FEATURES) + 4)
    assert_close(start, served, rtol=0.0, atol=atol, err_msg="package vs registered predictions")

    # Python's reference loop and the example (Node, or the page in Chromium) on the CSV file itself
    python_epochs = []
    python = train_package(chain.package, X, y, epochs=EPOCHS, seed=SEED, on_epoch=python_epochs.append)
    trained, epochs = _train(runtime, chain.folder, chain.csv, tmp_path)
    _check_trained(chain.package, split, feeds, y, trained, epochs, python, python_epochs)
    state = tmp_path / "trained.state"
    state.write_bytes(trained.to_bytes())

    # the state back as a version: its deploy graph is the trained graph (raw in, raw out), not scaled twice
    metrics = import_states(compose_pipeline(*chain.overrides), chain.tags["ortflow.registered_model"],
                            chain.tags["ortflow.registered_version"], [state], work_dir=tmp_path / "import")
    X_test, y_test = split.raw_X(split.X_test), split.raw_y(split.y_test)
    predicted = _predict(trained.trained_onnx_bytes(), {chain.package.record.data_inputs[0].name: X_test})
    errors = (predicted.astype(np.float64) - y_test) ** 2
    # the same graph on the same rows: only the mean's rounding differs
    assert abs(metrics["test_mse"] - errors.mean()) <= float(float32_sum_atol(errors.sum(), len(errors))) / len(errors)


def _converted(folder: Path, csv: Path | None = None, rows: list[dict] | None = None) -> dict:
    """The library's conversion (js/src/tables.js) of the CSV file's cells as examples/csv.mjs reads them (or of
    ``rows``, JSON records): the data inputs' values by name (float32 as numbers, NaN as null; dates as text)."""
    data = (json.dumps(rows) if rows is not None else
            f"csvData(readFileSync('{csv}', 'utf8'), manifest, {{header: true}}).X")
    script = f"""
import {{readFileSync}} from 'node:fs';
import {{csvData}} from '{(ROOT / "examples" / "csv.mjs").as_uri()}';
import {{tableColumns}} from '{(JS / "src" / "tables.js").as_uri()}';
const manifest = JSON.parse(readFileSync('{folder / "manifest.json"}', 'utf8'));
const columns = tableColumns(manifest.data_inputs, manifest.preprocess, {data});
console.log(JSON.stringify(Object.fromEntries(columns.map((c) => [c.spec.name,
  Array.from(c.data, (v) => (typeof v === 'bigint' ? String(v) : v))]))));
"""
    return json.loads(node("--input-type=module", "-e", script).stdout)


def _assert_same_cells(converted: dict, feeds: dict) -> None:
    """The library's conversion (``_converted``) equals the served model's feeds, cell for cell (NaN for NaN)."""
    assert set(converted) == set(feeds)
    for name, expected in feeds.items():
        ours = np.array(converted[name], dtype=object).reshape(expected.shape)
        if expected.dtype == np.float32:
            ours = np.where(ours == None, np.nan, ours).astype(np.float32)  # noqa: E711 - JSON's null: NaN
        np.testing.assert_array_equal(ours.astype(expected.dtype), expected, err_msg=name)


def test_the_conversion_of_edge_cells_is_the_served_models(mixed, tmp_path):
    """Cells of every kind written as a CSV may write them (spaces, signs, exponents, letter cases, the texts
    read_csv reads as missing, quoted text, times of day, dates before 1970 down to the first day pandas holds),
    converted by the library as the
    served model converts the same file read by pandas, and JSON's values as it converts a request's."""
    csv = tmp_path / "edge.csv"
    csv.write_text("area,garden,city,sold,target\n" + "\n".join([
        '1.5,True,paris,2020-01-05,1', ' 2.5,FALSE, lyon,1969-12-31,2', '+3,true,NA,1970-01-01,3',
        '-4e1,false,,2020-01-05 23:30,4', '.5,TRUE,1,2020-01-05T10:00:00,5', '6.,,007,,6', 'NA,NA,"a,b",NA,7',
        ',True,"say ""hi""",1900-02-28,8', 'nan,False,\u00e9t\u00e9,2000-02-29,9',
        '1e-50,tRuE,None,2262-04-11,10', '0,false,x,1677-09-22,11']) + "\n")
    pre = mixed.package.manifest["preprocess"]
    inputs = mixed.package.record.data_inputs
    _assert_same_cells(_converted(mixed.folder, csv), table_feeds(pd.read_csv(csv), pre["columns"], inputs,
                                                                   pre["text_missing"]))
    # JSON's values (a request to the served model): numbers and booleans in a text column as Python's str writes
    # them, 1 and 0 in a bool column
    rows = [{"area": a, "garden": b, "city": c, "sold": d} for a, b, c, d in zip(
        [1.5, None, 3, -0.25, 1e30], [True, False, 1, 0, None], [1.0, 2.5, 1e-7, True, 1e22],
        ["2020-01-05", None, "1969-07-20 20:17", "2000-02-29T00:00:00", "1700-03-01"])]
    _assert_same_cells(_converted(mixed.folder, rows=rows), table_feeds(pd.DataFrame(rows), pre["columns"], inputs,
                                                                         pre["text_missing"]))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_tables_package_trains_in_node_and_chromium_on_its_raw_cells(mixed, runtime, clean_mlflow_env, tmp_path):
    """A package of a table with number (gaps), bool (a gap), text (gaps, a quoted cell) and date (a gap) columns
    declares them; the examples hand the CSV's cells to the library, which converts them as the served model does
    (cell for cell), and trains to Python's weights and losses."""
    chain, split = mixed, mixed.split
    _use_store(chain.uri)
    pre = chain.package.manifest["preprocess"]
    assert pre["columns"] == {"area": "number", "garden": "bool", "city": "text", "sold": "date"}
    inputs = chain.package.record.data_inputs
    raw = chain.rows[list(pre["columns"])]
    feeds = table_feeds(raw, pre["columns"], inputs, pre["text_missing"])
    assert np.isnan(feeds["area"]).any() and np.isnan(feeds["garden"]).any()
    assert (feeds["city"] == pre["text_missing"]).any() and (feeds["sold"] == np.iinfo(np.int64).min).any()

    # the library's conversion of the CSV's cells is the served model's, cell for cell
    _assert_same_cells(_converted(chain.folder, chain.csv), feeds)

    # the registered version (raw columns in) and the package's prediction graph on those feeds agree
    served = np.asarray(mlflow.pyfunc.load_model(chain.model).predict(raw)["prediction"], np.float64)
    start = _predict(chain.package.initial_state().trained_onnx_bytes(), feeds)
    np.testing.assert_array_equal(start, served.astype(np.float32))

    # Python's reference loop on those feeds (a gap of a number or bool column NaN: the graph imputes it), and the
    # example (Node, or the page in Chromium) on the CSV file itself
    y = chain.rows["target"].to_numpy(np.float32)
    python_epochs = []
    python = train_package(chain.package, feeds, y, epochs=EPOCHS, seed=SEED, on_epoch=python_epochs.append)
    trained, epochs = _train(runtime, chain.folder, chain.csv, tmp_path)
    _check_trained(chain.package, split, feeds, y, trained, epochs, python, python_epochs)


def test_predict_evaluate_and_validation_data_take_a_tables_rows(mixed, tmp_path):
    """``predict`` takes a table's rows as objects, as arrays of cells and as {column: cells} alike, and gives what
    the package's graph gives on the served model's feeds; ``evaluate`` the loss of ``loss.onnx`` on them;
    ``validationData`` the same rows' loss after the epoch."""
    script = f"""
import {{createRequire}} from 'node:module';
import {{readFileSync}} from 'node:fs';
import {{Trainer}} from '{(JS / "node.js").as_uri()}';
import {{csvData}} from '{(ROOT / "examples" / "csv.mjs").as_uri()}';
const ort = createRequire('{JS / "package.json"}')('onnxruntime-node');
const trainer = await Trainer.load('{mixed.folder}', {{ort}});
const {{X, y}} = csvData(readFileSync('{mixed.csv}', 'utf8'), trainer.manifest, {{header: true}});
const names = Object.keys(trainer.manifest.preprocess.columns);
const forms = [X, X.map((row) => names.map((name) => row[name])),
  Object.fromEntries(names.map((name) => [name, X.map((row) => row[name])]))];
const predicted = [];
for (const form of forms) predicted.push(await trainer.predict(form));
const loss = await trainer.evaluate(X, y);
const history = await trainer.fit(X, y, {{epochs: 1, validationData: [X, y]}});
const after = await trainer.evaluate(X, y);
console.log(JSON.stringify({{predicted, loss, valLoss: history.history.val_loss[0], after}}));
"""
    out = json.loads(node("--input-type=module", "-e", script).stdout)
    assert out["predicted"][1] == out["predicted"][0] == out["predicted"][2]
    pre, split = mixed.package.manifest["preprocess"], mixed.split
    feeds = table_feeds(mixed.rows[list(pre["columns"])], pre["columns"], mixed.package.record.data_inputs,
                        pre["text_missing"])
    start = mixed.package.initial_state()
    expected = _predict(start.trained_onnx_bytes(), feeds)
    features = _weighed(start.trained_onnx_bytes(), feeds).astype(np.float64)
    terms = np.abs(features) @ np.abs(start.weights["coef"].astype(np.float64)).reshape(features.shape[1], -1)
    atol = float32_sum_atol(split.y_scale * (terms.ravel() + abs(float(start.weights["intercept"].ravel()[0]))) +
                            np.abs(expected) + abs(split.y_mean), features.shape[1] + 4)
    assert_close(np.array(out["predicted"][0]), expected, rtol=0.0, atol=atol, err_msg="predict vs the graph in Python")
    y = mixed.rows["target"].to_numpy(np.float32)
    loss = _loss(mixed.package, start.weights, feeds, y)
    assert abs(out["loss"] - loss) <= _loss_atol(loss, expected, y, split, float(np.max(atol)) / split.y_scale)(loss)
    assert out["valLoss"] == out["after"]  # validationData's loss is evaluate's on the same rows


#: injected faults of a table's CSV: (what is done to the frame, the row, the column, the cell)
FAULTS = {
    "bool": (lambda f: f.assign(garden=f.garden.where(f.index != 2, "maybe")), 2, "garden", '"maybe"'),
    "date": (lambda f: f.assign(sold=f.sold.where(f.index != 3, "someday")), 3, "sold", '"someday"'),
    "missing": (lambda f: f.drop(columns=["sold"]), None, "sold", None),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_bad_cell_or_a_missing_column_of_a_table_is_named_in_both_languages(mixed, fault, clean_mlflow_env,
                                                                              tmp_path):
    """A bool column's cell that is no boolean, a date column's that is no date, a missing column: the library (the
    Node example on the CSV file) names the row, the column, the cell and the file's line, and so does the served
    model (Python) for the same rows; nothing is trained."""
    change, row, column, cell = FAULTS[fault]
    frame = change(mixed.rows.astype(object))
    csv = tmp_path / "bad.csv"
    frame.to_csv(csv, index=False)
    done = subprocess.run([NODE, EXAMPLE, mixed.folder, csv, "--header", "--state", tmp_path / "s"], cwd=JS,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and not (tmp_path / "s").exists(), done.stderr
    if row is None:
        assert f'TrainingPackageError: X lacks the columns ["{column}"]' in done.stderr, done.stderr
    else:
        assert (f'TrainingPackageError: X holds {cell} at row {row}, column "{column}"' in done.stderr and
                f"{csv}, line {row + 2})" in done.stderr), done.stderr

    _use_store(mixed.uri)
    with pytest.raises(mlflow.exceptions.MlflowException) as error:
        mlflow.pyfunc.load_model(mixed.model).predict(frame.drop(columns=["target"]))
    assert (f"lacks the columns ['{column}']" if row is None else f"column '{column}' row {row}: ") in str(error.value)


def test_the_browser_page_names_a_bad_cell_of_a_tables_csv(mixed, tmp_path):
    """The page (examples/browser/index.html) reports a bad cell of a table's CSV by its row, column and line."""
    require_chromium()
    change, row, column, cell = FAULTS["bool"]
    change(mixed.rows.astype(object)).to_csv(tmp_path / "bad.csv", index=False)
    with PageServer({"/package/": mixed.folder, "/input/": tmp_path}) as server:
        query = "package=/package/&data=/input/bad.csv&header=1&autorun=1"
        with pytest.raises(RuntimeError) as error:
            open_page(f"{server.url}/examples/browser/index.html?{query}", timeout=120)
    assert f'X holds {cell} at row {row}, column "{column}"' in str(error.value), str(error.value)
    assert f"/input/bad.csv, line {row + 2})" in str(error.value), str(error.value)


@pytest.mark.parametrize("runtime", RUNTIMES[:2])
@pytest.mark.parametrize("cell, message", [("", "empty cell"), ("abc", '"abc" is not a finite number')])
def test_the_examples_refuse_an_empty_or_non_numeric_cell(tmp_path, runtime, cell, message):
    """A CSV cell of a package of numbers that is not a number is refused with its line and column, never read as 0:
    by the Node example and by the page (its CSV file read an empty cell as 0 before)."""
    require_node()
    folder, _, _ = make_package("linear", "sgd", tmp_path / "package")
    csv = tmp_path / "data" / "rows.csv"
    csv.parent.mkdir()
    csv.write_text(f"a,b,c,d,e,y\n1,2,3,4,5,6\n1,{cell},3,4,5,6\n")
    if runtime == "node":
        done = subprocess.run([NODE, EXAMPLE, folder, csv, "--header"], cwd=JS, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 1
        assert f"line 3, column 2 (b): {message}" in done.stderr, done.stderr
        return
    require_chromium()
    with PageServer({"/package/": folder, "/input/": csv.parent}) as server, pytest.raises(RuntimeError) as error:
        open_page(f"{server.url}/examples/browser/index.html?package=/package/&data=/input/rows.csv&header=1"
                  "&autorun=1", timeout=120)
    assert f"/input/rows.csv, line 3, column 2 (b): {message}" in str(error.value), str(error.value)
