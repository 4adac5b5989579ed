"""Errors a user makes, injected through the real command line: one line and a hint, status 2, no MLflow run."""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipelines.base.builders import trainer_verbose


_NO_CUDA = "CUDAExecutionProvider" not in __import__("onnxruntime").get_available_providers()


def _houses(folder):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(30, 2)), columns=["area", "rooms"]).assign(price=rng.normal(size=30))
    frame.to_csv(folder / "houses.csv", index=False)


@pytest.mark.parametrize("args,problem", [
    (["data=file", "data.path=missing.csv", "data.target=price"], "DataError: data.path='missing.csv': "),
    (["data=file", "data.path=houses.csv", "data.target=cost"],
     "DataError: data.target='cost' is not a column of houses.csv; its columns: ['area', 'rooms', 'price']"),
    (["data=file", "data.path=houses.csv", "data.target=rooms", "data.task=classification", "model=logistic",
      "loss=log"], "DataError: data.target='rooms' of houses.csv holds non-integral numbers"),
    (["trainer.max_iter=abc"], "'abc' of type 'str' could not be converted to Integer full_key: trainer.max_iter"),
    # the contract from conf to code: a setting the chosen part does not take, refused before any run
    (["trainer=torch", "trainer.weight_decay=0.5"],
     "ConfigError: trainer.weight_decay=0.5: trainer.optimizer=adam takes no weight_decay"),
    (["trainer.optimizer=sgd", "trainer.weight_decay=0.5"],
     "ConfigError: trainer.weight_decay=0.5: trainer.optimizer=sgd takes no weight_decay"),
    (["trainer=fwbw", "trainer.optimizer=adam", "trainer.momentum=0.5"],
     "ConfigError: trainer.momentum=0.5: trainer.optimizer=adam takes no momentum"),
    (["+trainer.foo=1"], "ConfigError: trainer.foo: not a setting of the config"),
    (["promotion.metric=nope"], "ConfigError: promotion.metric='nope' is not a metric of a regression evaluation"),
    (["trainer=torch", "trainer.gradients=ortflow"], "ConfigError: trainer.gradients=ortflow: trainer=torch takes no "
                                                     "gradients"),
    (["trainer=torch", "trainer.device=cpu:0"], "ConfigError: trainer.device='cpu:0': TorchTrainer runs on 'cpu' only"),
    pytest.param(["trainer.device=cuda"], "ConfigError: trainer.device=cuda: device='cuda' but this onnxruntime "
                 "build has no CUDA provider", marks=pytest.mark.skipif(not _NO_CUDA, reason="CUDA is available")),
])
def test_user_error_one_line_hint_status_2_no_run(tmp_path, pipeline_subprocess_env, args, problem):
    _houses(tmp_path)
    begin = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pipelines.main", *args], cwd=tmp_path,
                          env=pipeline_subprocess_env, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - begin
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 2 and lines[0].startswith("ortflow: error: ") and lines[1].startswith("  hint: "), lines
    assert problem in lines[0] and proc.stdout == ""
    assert not (tmp_path / "mlflow.db").exists()  # no store, so no run: found before MLflow was touched
    print(f"{' '.join(args)}: status 2 after {seconds:.2f} s")  # recorded in the report, not asserted


def test_stage_alone_and_debug_traceback(tmp_path, pipeline_subprocess_env):
    args = ["data=file", "data.path=missing.csv", "data.target=price"]
    proc = subprocess.run([sys.executable, "-m", "pipelines.convert", *args], cwd=tmp_path,
                          env=pipeline_subprocess_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("ortflow: error: DataError: data.path='missing.csv'")
    proc = subprocess.run([sys.executable, "-m", "pipelines.convert", *args, "debug=true"], cwd=tmp_path,
                          env=pipeline_subprocess_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback (most recent call last)" in proc.stderr
    assert "pipelines.base.errors.DataError: data.path='missing.csv'" in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_help_lists_stages_groups_and_examples(tmp_path, pipeline_subprocess_env):
    proc = subprocess.run([sys.executable, "-m", "pipelines.main", "--help"], cwd=tmp_path,
                          env=pipeline_subprocess_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "convert -> add_loss -> train -> evaluate -> export" in proc.stdout
    conf = Path(__file__).resolve().parent.parent / "conf"
    for group in ("data", "model", "trainer"):  # every option of the group, in the order a user scans them
        options = ", ".join(sorted(p.stem for p in (conf / group).glob("*.yaml")))
        assert f"{group}: {options}\n" in proc.stdout
    assert "python -m pipelines.main data=file data.path=houses.csv data.target=price" in proc.stdout


def test_progress_bar_when_stdout_is_a_terminal(compose_pipeline, monkeypatch):
    cfg = compose_pipeline()
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as terminal:
        monkeypatch.setattr(sys, "stdout", terminal)
        assert trainer_verbose(cfg) == 1
    os.close(master)
    with open(os.devnull, "w") as pipe:
        monkeypatch.setattr(sys, "stdout", pipe)
        assert trainer_verbose(cfg) == 0
        assert trainer_verbose(compose_pipeline("trainer.verbose=1")) == 1



def test_every_config_problem_of_a_launch_at_once(tmp_path, pipeline_subprocess_env):
    """Seen: each launch reported the first config error only. Now one report lists them all, each on its line,
    and the suggested names exist (``trainer.optimizer=adam``; ``model.start_max_iter`` for the renamed key)."""
    proc = subprocess.run([sys.executable, "-m", "pipelines.main", "data=iris", "model=linear",
                           "trainer.optimizer=adm", "data.test_size=1.5"], cwd=tmp_path,
                          env=pipeline_subprocess_env, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-3000:]
    assert lines[0] == "ortflow: error: ConfigError: 3 problems", lines
    assert [line.startswith("  - ") for line in lines[1:4]] == [True] * 3 and lines[4].startswith("  hint: ")
    text = "\n".join(lines)
    assert "did you mean trainer.optimizer=adam" in text
    assert "model=linear is a regression model but data=iris" in text and "data.test_size=1.5" in text
    assert not (tmp_path / "mlflow.db").exists()

    proc = subprocess.run([sys.executable, "-m", "pipelines.main", "model.sklearn_max_iter=1"], cwd=tmp_path,
                          env=pipeline_subprocess_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "hint: did you mean model.start_max_iter?" in proc.stderr, proc.stderr


@pytest.mark.parametrize("key, suggestion", [("trainer.lr", "trainer.learning_rate"),
                                             ("trainer.epochs", "trainer.max_iter")])
def test_a_key_named_as_other_libraries_name_it_suggests_the_right_one(tmp_path, pipeline_subprocess_env, key,
                                                                       suggestion):
    """Issue 41 item 6: ``trainer.lr=0.1`` suggested ``trainer.tol`` (difflib's closest spelling)."""
    proc = subprocess.run([sys.executable, "-m", "pipelines.main", f"{key}=0.1"], cwd=tmp_path,
                          env=pipeline_subprocess_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and f"hint: did you mean {suggestion}? " in proc.stderr, proc.stderr
    assert "trainer.tol" not in proc.stderr


def test_an_all_empty_column_is_named_with_the_configs_way_to_drop_it(tmp_path, pipeline_subprocess_env):
    """Issue 41 item 15: a column without any value ended in a ``to_onnx`` traceback in convert (its run FAILED),
    the hint naming SimpleImputer; now a one-line DataError before any run, naming the config's way to drop it."""
    rng = np.random.default_rng(0)
    pd.DataFrame({"area": rng.normal(size=60), "empty": [np.nan] * 60, "city": rng.choice(["a", "b"], 60),
                  "price": rng.normal(size=60)}).to_csv(tmp_path / "houses.csv", index=False)
    proc = subprocess.run([sys.executable, "-m", "pipelines.main", "data=file", "data.path=houses.csv",
                           "data.target=price"], cwd=tmp_path, env=pipeline_subprocess_env, capture_output=True,
                          text=True, timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and lines[0] == ("ortflow: error: DataError: the columns ['empty'] have no value in "
                                                 "the training rows: drop them with +preprocess.columns.empty=drop"), \
        proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "SimpleImputer" not in proc.stderr
    if (tmp_path / "mlflow.db").exists():  # the store may be made; no run is
        import sqlite3

        assert sqlite3.connect(tmp_path / "mlflow.db").execute("select count(*) from runs").fetchone() == (0,)


def test_a_stage_alone_from_another_problems_run_is_refused(tmp_path, run_chain_clean, compose_pipeline,
                                                            clean_mlflow_env, new_sqlite_store):
    """Issue 41 item 7: ``python -m pipelines.train source.run_id=<run>`` without that run's config groups trained
    its model but logged ``data.name=regression``, ``model.name=linear``; now refused, naming each difference."""
    from pipelines.base.schema import ConfigError
    from pipelines.execution.runner import run_standalone
    from pipelines.base.stages import stage_function

    uri = new_sqlite_store(tmp_path / "mlflow.db")
    source = run_chain_clean(["experiment=iris_logistic", f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path}",
                              "stages=[convert,add_loss]", "trainer.max_iter=1"], tmp_path / "source")
    add_loss = source.stage_run_ids["add_loss"]
    cfg = compose_pipeline(f"mlflow.tracking_uri={uri}", f"mlflow.root={tmp_path}", f"source.run_id={add_loss}")
    from mlflow import MlflowClient

    before = len(MlflowClient(uri).search_runs([source.tracking.experiment_id]))
    with pytest.raises(ConfigError, match=rf"source.run_id={add_loss} ran another problem: data.name=iris "
                                          r"\(source run\) but regression here.*model.name=logistic"):
        run_standalone("train", stage_function("train"), cfg)
    assert len(MlflowClient(uri).search_runs([source.tracking.experiment_id])) == before


def test_a_sweeps_best_trial_not_registered_is_said_in_a_sentence():
    """Seen: a sweep ended with ``ortflow: best trial <id> (...) not registered: false (promotion.register=
    if_promoted: ...)``, the run's tag printed as it is. The line says why in a sentence, and the way out."""
    from pipelines.tracking.promotion import Candidate, Decision
    from pipelines.tracking.sweep import not_registered

    candidate = Candidate("ortflow-regression-linear", "models:/m-1", "run", "test_mse", "minimize", 0.5, "champion",
                          policy="if_promoted")
    decision = Decision(False, "kept", "test_mse=0.5 does not beat version 1 (0.4)", "test_mse", "minimize",
                        "champion", 0.5, "1", 0.4)
    line = not_registered(candidate, decision)
    assert line == ("is not registered: promotion.register=if_promoted registers only a model that takes "
                    "@champion, and this one does not (test_mse=0.5 does not beat version 1 (0.4)). "
                    "promotion.register=always registers every best trial.")
    assert "false (" not in line and "(promotion.enabled=false): none does." in not_registered(candidate, None)
