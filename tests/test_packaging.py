"""The environments the project declares agree: `mlflow run`'s python_env.yaml installs what pyproject's cpu and
pipelines extras require, with the same version bounds."""

import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _requirements(specs):
    """name (normalised, extras dropped) -> version specifier, as written."""
    parsed = {}
    for spec in specs:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(.*?)\s*", spec)
        parsed[match.group(1).lower().replace("_", "-")] = match.group(3).replace(" ", "")
    return parsed


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is Python 3.11+")
def test_python_env_mirrors_the_cpu_and_pipelines_extras():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    expected = _requirements(project["dependencies"])
    for extra in ("cpu", "pipelines", "postgres"):
        expected.update(_requirements(extras[extra]))  # the cpu extra's onnx bound wins over the core's
    env = yaml.safe_load((ROOT / "python_env.yaml").read_text())
    declared = _requirements(env["dependencies"])
    assert declared == expected
    assert re.fullmatch(r"3\.\d+", str(env["python"])), "a minor version: MLflow picks its newest patch release"


def test_setuptools_reads_the_project_without_deprecation_warnings():
    """Issue 41 item 4: each install printed setuptools' ``project.license`` deprecation (a TOML table), three
    times, 45 lines; ``license`` is an SPDX expression."""
    pytest.importorskip("setuptools", minversion="77")
    import warnings

    from setuptools.config.pyprojecttoml import read_configuration

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = read_configuration(ROOT / "pyproject.toml")
    assert config["project"]["license"] == "MIT"
    assert not [str(w.message) for w in caught if "license" in str(w.message).lower()], caught


@pytest.mark.parametrize("build", ["training", "plain"])
def test_make_run_installs_what_the_main_job_needs_and_make_test_the_rest(build, tmp_path):
    """Issue 41 item 4: ``make run`` installed torch (754 MB) and Ray (240 MB), which the default chain does not
    use. What make would run (``make -n``, in an environment folder that does not exist yet): ``make run`` installs
    the onnxruntime build and the pipelines, ``make test`` adds the test tools, PostgreSQL's driver and (training
    build) torch and Ray, so that the README's ``make run`` then ``make test`` still sets everything up."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")

    def extras(target):
        args = ["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}", f"PYTHON={sys.executable}"]
        args.append("TRAINING_BUILD=" + ("12" if build == "training" else ""))  # whatever this interpreter is
        out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout
        [installed] = re.findall(r'pip install --quiet -e "\.\[([^\]]*)\]"', out)
        return set(installed.split(","))

    run, test = extras("run"), extras("test")
    onnxruntime = "cpu" if build == "training" else "ort"
    assert run == {onnxruntime, "pipelines"}, run
    assert not run & {"torch", "ray", "test"}
    assert test >= run | {"test", "postgres"} and (build == "plain" or test >= {"torch", "ray"}), test
