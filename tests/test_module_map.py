"""docs/DESIGN.md's module map lists every module of ``ortflow/`` and ``pipelines/``, and only those, each with the
first sentence of its docstring (``python -m tools.module_map --write`` regenerates it)."""

from __future__ import annotations

import re

import pytest

from tools import module_map


def test_design_map_is_up_to_date():
    text = module_map.DESIGN.read_text(encoding="utf-8")
    assert module_map.current_block(text) is not None, "docs/DESIGN.md lost its module map markers"
    assert module_map.current_block(text) == module_map.block(), "run: python -m tools.module_map --write"


def test_the_map_lists_exactly_the_modules_of_the_tree():
    on_disk = {f"{pkg}/{p.relative_to(module_map.ROOT / pkg).as_posix()}" for pkg in module_map.PACKAGES
               for p in module_map.modules(pkg)}
    listed_by_package = set()
    for table in module_map.module_map().split("**`")[1:]:
        package = table.split("/`**")[0]
        listed_by_package |= {f"{package}/{m}" for m in re.findall(r"^\| `([^`]+\.py)` \|", table, flags=re.M)}
    assert on_disk and listed_by_package == on_disk


def test_a_new_module_appears_and_one_without_docstring_is_named(tmp_path):
    for package in module_map.PACKAGES:
        (tmp_path / package / "sub").mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text('"""The package."""\n')
        (tmp_path / package / "sub" / "__init__.py").write_text('"""A sub-package: one idea. More text."""\n')
        leaf = '"""``leaf``: holds e.g. one thing, see :func:`f`.\n\nMore."""\n'
        (tmp_path / package / "sub" / "leaf.py").write_text(leaf)
    text = module_map.module_map(tmp_path)
    assert "| `sub/leaf.py` | `leaf`: holds e.g. one thing, see `f`. |" in text
    assert "| `sub/__init__.py` | A sub-package: one idea. |" in text
    (tmp_path / "ortflow" / "bare.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match=r"bare\.py has no docstring"):
        module_map.module_map(tmp_path)
