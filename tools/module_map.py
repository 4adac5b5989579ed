"""The module map of docs/DESIGN.md, generated from the tree: every module of ``ortflow/`` and ``pipelines/`` with
the first sentence of its docstring.

``python -m tools.module_map`` prints the map; ``--write`` replaces the block between the markers of
docs/DESIGN.md; ``--check`` exits 1 when that block is out of date (tests/test_module_map.py does the same).
A module without a docstring is an error naming it: the map's line comes from there.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "DESIGN.md"
PACKAGES = ("ortflow", "pipelines")
BEGIN = "<!-- MODULE-MAP:BEGIN (written by python -m tools.module_map --write; edit the modules' docstrings) -->"
END = "<!-- MODULE-MAP:END -->"


def modules(package: str, root: Path = ROOT) -> list[Path]:
    """Every module of ``package``, sub-packages included, in path order (``__init__.py`` first in a folder)."""
    base = root / package
    found = [p for p in base.rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(found, key=lambda p: (p.parent.relative_to(base).parts, p.name != "__init__.py", p.name))


def summary(path: Path) -> str:
    """The first sentence of the module's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not doc or not doc.strip():
        raise ValueError(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} has no docstring: "
                         "its first sentence is its line in the module map")
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    match = re.search(r"(?<![ .]e\.g)(?<![ .]i\.e)\.(\s|$)", paragraph)
    sentence = paragraph[: match.start() + 1] if match else paragraph
    sentence = re.sub(r":(?:func|class|mod|data|meth|attr):`~?([^`]+)`", r"`\1`", sentence)  # reST roles
    return sentence.replace("``", "`").replace("|", "\\|")


def module_map(root: Path = ROOT) -> str:
    """The Markdown tables of the map, one per package."""
    parts = []
    for package in PACKAGES:
        parts.append(f"**`{package}/`**\n\n| module | holds |\n|---|---|")
        for path in modules(package, root):
            parts[-1] += f"\n| `{path.relative_to(root / package).as_posix()}` | {summary(path)} |"
    return "\n\n".join(parts)


def block(root: Path = ROOT) -> str:
    return f"{BEGIN}\n\n{module_map(root)}\n\n{END}"


def current_block(text: str) -> str | None:
    match = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), text, flags=re.S)
    return match.group(0) if match else None


def write(path: Path = DESIGN) -> bool:
    """Replace the map's block in ``path``; True when it changed."""
    text = path.read_text(encoding="utf-8")
    old = current_block(text)
    if old is None:
        raise ValueError(f"{path}: no module map markers ({BEGIN!r} ... {END!r})")
    new = block()
    path.write_text(text.replace(old, new), encoding="utf-8")
    return old != new


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.module_map", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the map in docs/DESIGN.md")
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/DESIGN.md's map is out of date")
    args = parser.parse_args(argv)
    if args.write:
        print("docs/DESIGN.md: module map " + ("rewritten" if write() else "already up to date"))
    elif args.check:
        if current_block(DESIGN.read_text(encoding="utf-8")) != block():
            print("docs/DESIGN.md: the module map is out of date; run python -m tools.module_map --write")
            return 1
    else:
        print(module_map())
    return 0


if __name__ == "__main__":
    sys.exit(main())
