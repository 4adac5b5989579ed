"""Issue 46, set-up as a new user meets it: ``make run PYTHON=python3.13`` under pyenv, a script next to the clone
(the repository folder shadowing the installed package), and the trainers' defaults on small tables."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _fake_pyenv(tmp_path: Path, installed: bool) -> dict[str, str]:
    """A PATH where ``python3.13`` is pyenv's shim refusing a version not selected (``pyenv: python3.13: command
    not found``, status 127) and ``pyenv root`` a folder holding (``installed``) versions/3.13.5/bin/python3.13."""
    bin_dir, root = tmp_path / "bin", tmp_path / "pyenv"
    bin_dir.mkdir()
    (bin_dir / "pyenv").write_text(f"#!/bin/sh\n[ \"$1\" = root ] && echo {root}\n")
    (bin_dir / "python3.13").write_text("#!/bin/sh\necho 'pyenv: python3.13: command not found' >&2\nexit 127\n")
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    if installed:
        version = root / "versions" / "3.13.5" / "bin"
        version.mkdir(parents=True)
        (version / "python3.13").symlink_to(sys.executable)  # any interpreter: make only asks its version
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_finds_pyenvs_interpreter_of_a_version_not_selected(tmp_path):
    """Seen: ``make run PYTHON=python3.13``, as the README says, failed under pyenv: ``pyenv: python3.13: command
    not found`` (the shim of a version installed but not selected in the folder)."""
    env = _fake_pyenv(tmp_path, installed=True)
    args = ["make", "-n", "-C", str(ROOT), "run", "PYTHON=python3.13", f"VENV={tmp_path / 'venv'}"]
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60, check=True).stdout
    interpreter = tmp_path / "pyenv" / "versions" / "3.13.5" / "bin" / "python3.13"
    assert f"{interpreter} -m venv {tmp_path / 'venv'}" in out, out


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_with_a_python_that_does_not_run_says_how_to_get_one(tmp_path):
    env = _fake_pyenv(tmp_path, installed=False)
    proc = subprocess.run(["make", "-C", str(ROOT), "run", "PYTHON=python3.13", f"VENV={tmp_path / 'venv'}"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ("make: PYTHON=python3.13 does not run here: install it (pyenv install 3.13, or your system's package) or "
            "name its path (PYTHON=/path/to/python3.x)") in proc.stdout
    assert not (tmp_path / "venv").exists()


def _script_next_to_a_clone(tmp_path: Path) -> tuple[Path, Path]:
    """``(script, clone)``: a folder ``ortflow`` (a clone of the repository: the package inside it, no
    ``__init__.py`` at its root) and a script beside it importing the trainer."""
    clone = tmp_path / "ortflow"
    clone.mkdir()
    (clone / "ortflow").symlink_to(ROOT / "ortflow", target_is_directory=True)
    script = tmp_path / "script.py"
    script.write_text("from ortflow import OrtGradientOptimizer\nprint(OrtGradientOptimizer.__module__)\n")
    return script, clone


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_a_script_next_to_the_clone_imports_the_package_not_the_clones_folder(tmp_path):
    """Seen: a script next to the clone's folder: ``ImportError: cannot import name 'OrtGradientOptimizer' from
    'ortflow' (unknown location)``: the folder, without ``__init__.py``, is a namespace package found on the path
    before setuptools' editable finder (consulted after the path) finds the installed one. ``make`` installs in
    setuptools' compat mode: the clone's folder is on the path (a .pth line), where the package inside it wins."""
    out = subprocess.run(["make", "-n", "-C", str(ROOT), "run", f"PYTHON={sys.executable}",
                          f"VENV={tmp_path / 'venv'}"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "--config-settings editable_mode=compat" in out
    script, clone = _script_next_to_a_clone(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # compat mode's .pth line: the clone's folder at the end of the path, after the script's own folder
    code = f"import runpy, sys; sys.path.append({str(clone)!r}); runpy.run_path({str(script)!r})"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ortflow.trainers.full", proc.stderr[-2000:]


@pytest.mark.parametrize("trainer", ["full", "fwbw"])
def test_a_table_smaller_than_the_batch_trains_in_one_batch_with_a_line(trainer):
    """Seen: a table smaller than ``batch_size`` was refused (``batch_size=32 is larger than the number of training
    samples``); scikit-learn clips the batch to the rows. Now each epoch is one batch of every row, with a line,
    and the parameter stays as set."""
    import numpy as np
    from sklearn.linear_model import LinearRegression

    from ortflow import OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer, add_loss_output, to_onnx

    rng = np.random.default_rng(0)
    X = rng.normal(size=(6, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5]) + 0.3).astype(np.float32)
    graph = to_onnx(LinearRegression().fit(X, y * 0), X)
    est = (OrtGradientOptimizer(add_loss_output(graph), batch_size=32, max_iter=3, learning_rate=0.05)
           if trainer == "full" else
           OrtGradientForwardBackwardOptimizer(graph, batch_size=32, max_iter=3, learning_rate=0.05))
    with pytest.warns(UserWarning, match="batch_size=32 is larger than the 6 training samples: each epoch trains "
                                         "them in one batch of 6"):
        est.fit(X, y)
    assert est.get_params()["batch_size"] == 32 and len(est.train_losses_) == 3
    assert est.train_losses_[-1] < est.train_losses_[0]
    # one batch of 6 per epoch: the weights of batch_size=6, within float32 rounding of 3 epochs' sums of 6 rows
    same = est.__class__(**{**est.get_params(), "batch_size": 6}).fit(X, y)
    coef = same.get_state()["coef"]
    np.testing.assert_allclose(est.get_state()["coef"], coef,
                               atol=3 * 6 * np.finfo(np.float32).eps * float(np.abs(coef).max() + np.abs(X).max()))


def test_a_folder_named_ortflow_where_the_pipelines_run_is_named(tmp_path):
    """The same shadowing met by the pipelines (``python -m pipelines.main`` from the folder holding the clone, the
    project installed editable in setuptools' default mode, whose finder the path goes before): refused at once,
    naming the folder and the fix, instead of an ImportError deep inside. Emulated: a finder like setuptools'
    (``ortflow``/``pipelines`` -> this repository) asked after the path, which starts at a folder holding ``ortflow/``
    without ``__init__.py``."""
    (tmp_path / "ortflow").mkdir()
    code = f"""
import importlib.machinery, sys
class Editable:  # setuptools' strict editable finder: a meta path finder after the path's
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name in ("ortflow", "pipelines"):
            return importlib.machinery.PathFinder.find_spec(name, [{str(ROOT)!r}])
        return None
sys.meta_path = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]  # the venv's own
sys.meta_path.append(Editable)
sys.path = [{str(tmp_path)!r}] + [p for p in sys.path if p not in ("", {str(ROOT)!r})]
import pipelines
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert (f"ImportError: 'ortflow' resolves to the folder {tmp_path / 'ortflow'}, which holds no ortflow package "
            "(no __init__.py)") in proc.stderr, proc.stderr[-2000:]
    assert "editable_mode=compat" in proc.stderr
    (tmp_path / "ortflow").rename(tmp_path / "elsewhere")  # without the folder: the package, through the finder
    proc = subprocess.run([sys.executable, "-c", code + "import ortflow; print(ortflow.__file__)"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == str(ROOT / "ortflow" / "__init__.py"), proc.stderr
