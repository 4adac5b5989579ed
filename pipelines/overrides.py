"""What a command line may change: the overrides every entry point accepts (CLI and ``mlflow run``).

Hydra instantiates any ``_target_`` it finds under ``hydra.callbacks``, ``hydra.launcher`` or ``hydra.sweeper``
before the app runs, so an override such as ``+hydra.callbacks.x._target_=shutil.copyfile`` would call an
arbitrary function in whoever runs the command (``mlflow run . -P overrides=...`` hands such strings from a
caller to the project). :func:`check_overrides` refuses, before Hydra composes anything:

- a ``_target_`` outside :data:`ALLOWED_TARGETS`, as a key or inside a dict/list value;
- any edit of ``hydra.callbacks`` and of ``hydra.searchpath`` (which would bring in other config files);
- a config group choice that is not a plain option name (``experiment=../../x`` would load any YAML file);
- command-line flags other than those that only print or pick the run mode (``--config-dir``, ``--config-name``,
  ``--experimental-rerun`` (a pickle), ``--shell-completion`` ... are refused).
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .base import errors
from .base.errors import UserError

#: the ``_target_`` values an override may name (the project's own)
ALLOWED_TARGETS = frozenset({"pipelines.orchestration.sweep_callback.MlflowSweepCallback"})
#: flags that only print information or choose between a run and a multirun, with the values they take
_INFO = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")
ALLOWED_FLAGS: dict[str, tuple[str, ...] | None] = {
    "-m": (), "--multirun": (), "-c": ("job", "hydra", "all"), "--cfg": ("job", "hydra", "all"), "-p": None,
    "--package": None, "--resolve": (), "-h": (), "--help": (), "--hydra-help": (), "-i": _INFO, "--info": _INFO,
    "--version": ()}
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_GROUPS = frozenset(p.name for p in (Path(__file__).resolve().parent.parent / "conf").iterdir() if p.is_dir())


class UnsafeOverrideError(UserError, ValueError):
    """A command-line override or flag that could run code outside the project; the message names it."""


def _values(value: Any) -> Iterator[Any]:
    """Every element of an override's value: sweeps expanded, dicts and lists walked."""
    if hasattr(value, "list") and isinstance(getattr(value, "list"), list):  # ChoiceSweep
        for item in value.list:
            yield from _values(item)
    elif isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _values(item)
    elif isinstance(value, list):
        for item in value:
            yield from _values(item)
    else:
        yield value


def check_overrides(args: Sequence[str]) -> None:
    """Raise :class:`UnsafeOverrideError` for the first override or flag in ``args`` that is not allowed."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    words, index = list(args), 0
    overrides = []
    while index < len(words):
        word = words[index]
        flag = word.split("=", 1)[0]
        if word.startswith("-") and not word.startswith("~"):
            if flag not in ALLOWED_FLAGS:
                raise UnsafeOverrideError(
                    f"command-line flag {flag!r} is not accepted (it could load files or code from elsewhere); "
                    f"allowed: {sorted(ALLOWED_FLAGS)}")
            takes = ALLOWED_FLAGS[flag]
            following = words[index + 1] if index + 1 < len(words) else None
            consumed = "=" not in word and following is not None and (takes is None or following in takes)
            index += 2 if consumed else 1
            continue
        overrides.append(word)
        index += 1
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException:
        return  # Hydra refuses the same text with its own message before composing anything
    for text, override in zip(overrides, parsed):
        key = override.key_or_group
        if key.startswith(("hydra.callbacks", "hydra.searchpath")) or key in ("hydra", "hydra/callbacks"):
            raise UnsafeOverrideError(
                f"override {text!r} edits {key}: Hydra instantiates what it holds before anything else runs; "
                "the project's callbacks are fixed in conf/config.yaml")
        value = None if override.is_delete() else override.value()
        if "_target_" in key.split("."):
            _check_target(text, value)
        for item in _values(value):
            if isinstance(item, dict) and "_target_" in item:
                _check_target(text, item["_target_"])
        if "/" in key or key in _GROUPS:
            for item in _values(value):
                if item is not None and not (isinstance(item, str) and _PLAIN_NAME.match(item)):
                    raise UnsafeOverrideError(
                        f"override {text!r}: {item!r} is not an option name of the config group {key!r} "
                        "(options are files of conf/ or of installed Hydra plugins, named without a path)")


def _check_target(text: str, target: Any) -> None:
    if target not in ALLOWED_TARGETS:
        raise UnsafeOverrideError(
            f"override {text!r} names _target_={target!r}: only the project's own targets "
            f"{sorted(ALLOWED_TARGETS)} may be instantiated from the command line")


def guarded(main: Callable[[], Any]) -> Callable[[], Any]:
    """Wrap a ``@hydra.main`` entry point: ``sys.argv`` is checked by :func:`check_overrides` first, and an
    expected error (:func:`pipelines.base.errors.hint_for`) ends the command with one line, a hint and status 2,
    an interruption with one line and status 130 or 143 (:func:`pipelines.base.errors.exit_if_interrupted`)."""

    @functools.wraps(main)
    def entry(*args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # a direct call with a config: nothing else to do
            return main(*args, **kwargs)
        argv = sys.argv[1:]
        if errors.wants_traceback(argv):
            check_overrides(argv)
            return main()
        try:
            with errors.hydra_raises():  # instead of printing its own multi-line report: reported here
                check_overrides(argv)
                return main()
        except Exception as exc:
            errors.exit_if_expected(exc)
            raise
        except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM: one line naming the runs it ended
            errors.exit_if_interrupted(exc)
            raise

    return entry
