"""The console transcripts of docs/PIPELINES.md marked ``<!-- run by tests/test_pipeline_docs.py -->``, run as
written: each ``$ command`` in a fresh folder holding the ``houses.csv`` the page describes; every line shown
must be printed (``…`` stands for text left out), and a transcript showing ``ortflow: error:`` exits with status 2.
"""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "PIPELINES.md"
MARK = "<!-- run by tests/test_pipeline_docs.py -->"


def transcripts() -> list[tuple[str, list[str]]]:
    """(command, lines shown) of every marked console block, in page order."""
    found = []
    for block in re.findall(re.escape(MARK) + r"\n```console\n(.*?)```", DOC.read_text(), re.S):
        for chunk in block.split("$ ")[1:]:
            command, *shown = chunk.rstrip("\n").split("\n")
            found.append((command, shown))
    return found


def write_houses(folder: Path) -> None:
    """The table of 'Your own data': area, rooms, city (text), price; rows 6 and 18 miss their area."""
    rng = np.random.default_rng(0)
    n = 200
    frame = pd.DataFrame({"area": rng.normal(100, 25, n).round(1), "rooms": rng.integers(1, 7, n),
                          "city": rng.choice(["Lyon", "Paris", "Nantes"], n)})
    frame["price"] = (2.5 * frame.area + 12 * frame.rooms + rng.normal(0, 10, n)).round(1)
    frame.loc[[5, 17], "area"] = np.nan
    frame.to_csv(folder / "houses.csv", index=False)


def _printed(line: str, output: list[str]) -> bool:
    pieces = [p for p in line.split("…") if p]
    for out in output:
        at = 0
        for piece in pieces:
            at = out.find(piece, at)
            if at < 0:
                break
            at += len(piece)
        else:
            return True
    return False


def test_transcripts_are_marked():
    commands = [c for c, _ in transcripts()]
    assert len(commands) >= 6 and all(c.startswith("python -m pipelines.") for c in commands)


@pytest.mark.slow
def test_documented_commands_print_what_the_page_shows(tmp_path, pipeline_subprocess_env):
    write_houses(tmp_path)
    for command, shown in transcripts():
        words = shlex.split(command)
        proc = subprocess.run([sys.executable, *words[1:]], cwd=tmp_path, env=pipeline_subprocess_env,
                              capture_output=True, text=True, timeout=300)
        output = (proc.stdout + proc.stderr).splitlines()
        expected = 2 if any(line.startswith("ortflow: error:") for line in shown) else 0
        assert proc.returncode == expected, (command, output[-30:])
        for line in shown:
            assert _printed(line, output), (command, line, output[-30:])
