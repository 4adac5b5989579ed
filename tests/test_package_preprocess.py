"""export_training_package(..., feature_scaling=, target_scaling=): the standardization inside the package's graphs
(the manifest's ``preprocess``), so the package trains on raw rows and predicts in the target's units (issue 47,
item 2); the reference loop refuses an empty or non-numeric cell naming its row and column.

The standardized rows below are computed in float32 as the graphs compute them (``Sub`` then ``Div``, each
correctly rounded in numpy and in onnxruntime): the package fed raw rows and the package without preprocessing fed
those rows run the same arithmetic, so their losses and weights are equal, not close.
"""

import json
import warnings

import numpy as np
import pytest
from sklearn.datasets import make_regression
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPRegressor

import ortflow
from ortflow._ort import InferenceSession
from ortflow.exceptions import TrainingPackageError
from ortflow.package import TrainingPackage, train_package
from ortflow.package.format import Manifest

NAMES = ["a", "b", "c"]


@pytest.fixture(scope="module")
def raw():
    """Raw rows far from standardized, their statistics (float32, as the graph holds them) and an MLP trainer fitted
    on the standardized rows."""
    X, y = make_regression(50, n_features=3, noise=1.0, random_state=0)
    X = (X * [1.0, 10.0, 100.0] + [5.0, -50.0, 1000.0]).astype(np.float32)
    y = (y * 3.0 + 500.0).astype(np.float32)
    m, s = X.mean(axis=0), X.std(axis=0)
    ym, ys = np.float32(y.mean()), np.float32(y.std())
    X_std, y_std = (X - m) / s, (y - ym) / ys  # float32 arithmetic, as the graphs'
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlp = MLPRegressor(hidden_layer_sizes=(4,), max_iter=3, random_state=0).fit(X_std, y_std)
    graph = ortflow.add_loss_output(ortflow.to_onnx(mlp), "squared_error")
    est = ortflow.OrtGradientOptimizer(graph, learning_rate=ortflow.LearningRateAdam(eta0=0.01), batch_size=16)
    return est, X, y, (m, s), (ym, ys), X_std, y_std


def _predict(model: bytes, X) -> np.ndarray:
    session = InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: X})[0].ravel()


@pytest.mark.parametrize("unrolled", [False, True])
def test_a_package_with_scaling_trains_on_raw_rows_as_one_without_on_standardized_rows(raw, tmp_path, unrolled):
    est, X, y, features, target, X_std, y_std = raw
    plain = ortflow.export_training_package(est, tmp_path / "plain")
    scaled = ortflow.export_training_package(est, tmp_path / "scaled", feature_names=NAMES, feature_scaling=features,
                                             target_scaling=target)
    pre = TrainingPackage(scaled).manifest["preprocess"]
    assert pre["features"] == {"input": "X", "mean": features[0].tolist(), "scale": features[1].tolist()}
    assert pre["target"] == {"input": "label", "mean": [float(target[0])], "scale": [float(target[1])]}
    assert pre["prediction"] == ["variable"] and pre["columns"] is None
    assert "preprocess" in TrainingPackage(plain).manifest and TrainingPackage(plain).record.preprocess.features is None

    ours, theirs = [], []
    a = train_package(scaled, X, y, epochs=2, seed=1, on_epoch=ours.append, unrolled=unrolled)
    b = train_package(plain, X_std, y_std, epochs=2, seed=1, on_epoch=theirs.append, unrolled=unrolled)
    assert ours == theirs  # the loss the Python trainer reports: on the standardized target
    for name, value in b.weights.items():
        np.testing.assert_array_equal(a.weights[name], value, err_msg=name)
    # predictions in the target's units: the standardized prediction times the scale plus the mean (float32)
    np.testing.assert_array_equal(_predict(a.trained_onnx_bytes(), X),
                                  _predict(b.trained_onnx_bytes(), X_std) * target[1] + target[0])


def test_a_state_estimator_keeps_the_preprocessing_once(raw, tmp_path):
    """TrainingState.estimator()'s graph holds the maps: exported again (with the same maps, or none) they are not
    applied twice; other maps are refused."""
    est, X, y, features, target, *_ = raw
    folder = ortflow.export_training_package(est, tmp_path / "first", feature_scaling=features, target_scaling=target)
    state = train_package(folder, X, y, epochs=1)
    again = ortflow.export_training_package(state.estimator(), tmp_path / "again", feature_scaling=features,
                                            target_scaling=target)
    bare = ortflow.export_training_package(state.estimator(), tmp_path / "bare")
    for other in (again, bare):
        assert TrainingPackage(other).manifest["preprocess"] == TrainingPackage(folder).manifest["preprocess"]
        np.testing.assert_array_equal(_predict(TrainingPackage(other).initial_state().trained_onnx_bytes(), X),
                                      _predict(state.trained_onnx_bytes(), X))
    with pytest.raises(TrainingPackageError, match="already holds the features' standardization"):
        ortflow.export_training_package(state.estimator(), tmp_path / "other",
                                        feature_scaling=(features[0] + 1, features[1]))


def test_bad_scalings_are_refused_naming_the_problem(raw, tmp_path):
    est, X, y, features, target, *_ = raw
    with pytest.raises(TrainingPackageError, match="preprocess.features.mean: 2 values, but 'X' has 3 columns"):
        ortflow.export_training_package(est, tmp_path / "a", feature_scaling=(features[0][:2], features[1][:2]))
    with pytest.raises(TrainingPackageError, match="feature_scaling: mean and scale must be finite.*no scale 0"):
        ortflow.export_training_package(est, tmp_path / "b", feature_scaling=(features[0], [1.0, 0.0, 1.0]))
    clf = LogisticRegression(max_iter=5).fit(X, y > np.median(y))
    trainer = ortflow.OrtGradientOptimizer(ortflow.add_loss_output(ortflow.to_onnx(clf), "log"))
    with pytest.raises(TrainingPackageError, match="target_scaling is for a regressor's values"):
        ortflow.export_training_package(trainer, tmp_path / "c", target_scaling=target)
    folder = ortflow.export_training_package(est, tmp_path / "d", feature_scaling=features, target_scaling=target,
                                             columns={"a": "number"}, text_missing="?")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["preprocess"]["columns"] == {"a": "number"} and manifest["preprocess"]["text_missing"] == "?"
    manifest["preprocess"]["prediction"] = ["nope"]
    with pytest.raises(TrainingPackageError, match=r"preprocess.prediction\[0\]: 'nope' is not an output"):
        Manifest.from_json(manifest)


@pytest.mark.parametrize("cell, message", [("", "an empty cell"), ("x", '"x", not a number,'),
                                           (None, r"a non-finite value \(NaN\)")])
def test_the_reference_loop_refuses_an_empty_or_non_numeric_cell(raw, tmp_path, cell, message):
    """Named by row and column (from 0) as the JavaScript library names a non-finite value (tests/test_js_errors.py)."""
    est, X, y, features, target, *_ = raw
    folder = ortflow.export_training_package(est, tmp_path / "p", feature_names=NAMES, feature_scaling=features,
                                             target_scaling=target)
    rows = X.astype(object)
    rows[4, 1] = cell
    with pytest.raises(TrainingPackageError, match=rf"X \('X'\) holds {message} at row 4, column 1 \('b'\)"):
        train_package(folder, rows, y)
    bad = X.copy()
    bad[2, 2] = -np.inf
    with pytest.raises(TrainingPackageError, match=r"a non-finite value \(-Infinity\) at row 2, column 2 \('c'\)"):
        train_package(folder, bad, y)
    targets = y.astype(object)
    targets[7] = ""
    with pytest.raises(TrainingPackageError, match="y holds an empty cell at row 7"):
        train_package(folder, X, targets)
