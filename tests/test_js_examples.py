"""The Node example (examples/node/train.mjs) trains a package from a CSV file of string class labels and writes a
state Python reads: the weights the reference loop reaches (the rule of tests/js_support.py), the trained graph
beside it; bad input ends it with the library's error and exit status 1."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from ortflow.package import load_training_state, train_package

from js_support import JS_GROUP, NODE, ROOT, make_package, require_node, weights_atol

pytestmark = JS_GROUP
EXAMPLE = ROOT / "examples" / "node" / "train.mjs"


def _example(*args):
    return subprocess.run([NODE, str(EXAMPLE), *map(str, args)], capture_output=True, text=True, timeout=120)


def test_node_example_trains_from_csv(tmp_path):
    require_node()
    folder, X, y = make_package("binary", "sgd", tmp_path / "package")
    csv = tmp_path / "data.csv"
    csv.write_text("".join(",".join([*(repr(float(v)) for v in row), label]) + "\n" for row, label in zip(X, y)))
    state_file, model_file = tmp_path / "out.state", tmp_path / "out.onnx"
    done = _example(folder, csv, "--epochs", 2, "--seed", 5, "--state", state_file, "--model", model_file)
    assert done.returncode == 0, done.stderr
    assert "epoch 2: loss" in done.stdout and f"state written to {state_file}" in done.stdout
    state = load_training_state(folder, state_file)
    reference = train_package(folder, X, y, epochs=2, seed=5)
    assert state.steps == reference.steps == 8
    for name, expected in reference.tensors.items():
        np.testing.assert_allclose(state.tensors[name], expected, rtol=0,
                                   atol=weights_atol(reference.steps, expected), err_msg=name)
    assert model_file.read_bytes() == state.trained_onnx_bytes()


def test_node_example_names_a_bad_label(tmp_path):
    require_node()
    folder, X, y = make_package("binary", "sgd", tmp_path / "package")
    csv = tmp_path / "data.csv"
    csv.write_text("".join(",".join([*(str(float(v)) for v in row), "maybe" if i == 4 else label]) + "\n"
                           for i, (row, label) in enumerate(zip(X, y))))
    done = _example(folder, csv, "--state", tmp_path / "out.state")
    assert done.returncode == 1
    assert 'TrainingPackageError: y holds the label "maybe" (row 4)' in done.stderr
    assert not (tmp_path / "out.state").exists()
