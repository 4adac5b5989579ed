"""A new shell after ``make run`` (issue 41 item 4): ``python -m pipelines.main`` failed with "No module named
'omegaconf'" and the ``mlflow ui ...`` line the chain prints with "mlflow: command not found", the environment not
being activated there."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from pipelines.tracking.store import Tracking

README = Path(__file__).resolve().parents[1] / "README.md"
BARE_PATH = "/usr/bin:/bin"  # a new shell: the environment's bin folder is not on it


def test_the_ui_line_runs_in_a_shell_without_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", BARE_PATH)
    monkeypatch.chdir(tmp_path)
    hint = Tracking("sqlite:///mlflow.db", None, "0", "ortflow", tmp_path, retries=0).ui_hint()
    command = shlex.split(hint.split("#")[0])
    program = command[: command.index("ui")]
    assert command[len(program):] == ["ui", "--backend-store-uri", "sqlite:///mlflow.db", "--port", "5000"]
    proc = subprocess.run([*program, "--version"], env={**os.environ, "PATH": BARE_PATH}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "version" in proc.stdout.lower(), (hint, proc.stderr)


def test_the_readme_says_how_a_new_shell_gets_the_environment():
    (line,) = re.findall(r"^source (\.venv/bin/activate)\b.*$", README.read_text(), flags=re.M)
    activate = Path(sys.prefix) / "bin" / "activate"  # this environment's, wherever the tests run it
    assert line == ".venv/bin/activate" and activate.exists()
    script = f"source {shlex.quote(str(activate))} && python -c 'import omegaconf, pipelines' && command -v mlflow"
    proc = subprocess.run(["bash", "-c", script], env={**os.environ, "PATH": BARE_PATH}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().startswith(sys.prefix), proc.stderr
