"""Errors a user makes, and how an entry point reports them: one line, a hint, exit status 2.

An expected error (a config that cannot work, data that cannot be used, a tracking store that does not answer, a
refused override, an input run that lacks what a stage needs) is the user's to fix, not a bug: the command prints
``ortflow: error: <Type>: <message>`` and a ``hint:`` line on stderr and exits with status 2, without a traceback.
``ORTFLOW_TRACEBACK=1`` or ``HYDRA_FULL_ERROR=1`` in the environment, ``debug=true`` (``--verbose`` for
``python -m pipelines.import_states``) on the command line shows the traceback instead. Any other exception is a
bug and keeps its traceback (status 1). Ctrl-C and SIGTERM print one line too, naming the signal and the runs it
ended KILLED, with status 130 (SIGINT) or 143 (SIGTERM): :func:`exit_if_interrupted`.

This module imports nothing heavy: it is loaded before the config is composed.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import TextIO

#: the exit status of a command stopped by an expected error
USER_ERROR_STATUS = 2
#: the environment variable that asks every entry point for tracebacks
TRACEBACK_ENV = "ORTFLOW_TRACEBACK"
#: the attribute of an exception listing the runs it ended (``["<run id> KILLED", ...]``, set by
#: :mod:`pipelines.tracking.runs`), for the one-line report
ENDED_RUNS_ATTR = "ortflow_ended_runs"


class UserError(Exception):
    """Base of the errors fixed by changing the command line, the config, the data or the environment."""

    hint = "python -m pipelines.main --help lists the stages, the config groups and examples"


class DataError(UserError, ValueError):
    """Data that cannot be used as configured; the message names the file, the columns or the rows."""

    hint = "see 'Your own data' in docs/PIPELINES.md (data.drop_invalid=true drops unusable columns and rows)"

    def __init__(self, *args, hint: str | None = None):
        super().__init__(*args)
        if hint is not None:  # a hint of its own: a streamed table's (stream_hint), where drop_invalid does not apply
            self.hint = hint


def stream_hint(key_set: bool) -> str:
    """The hint of a DataError about a Parquet table streamed (``data=parquet``): its doc section and its keys
    (``data.key`` only where none is set)."""
    keys = ("" if key_set else "data.key, ") + ("data.test_size, data.validation_fraction, data.features, "
                                                "+preprocess.columns.<column>=drop")
    return f"see 'Parquet larger than memory' in docs/PIPELINES.md ({keys})"


class TrackingUnavailableError(UserError, RuntimeError):
    """The tracking store cannot be reached; the message names its URI and where local outputs were kept."""

    hint = "start the tracking server, or unset MLFLOW_TRACKING_URI and mlflow.tracking_uri for ./mlflow.db"


_CONFIG_HINT = ("python -m pipelines.main --help lists the config groups; "
                "add --cfg job to print the composed config without running anything")
# expected errors defined in modules that are imported only when they can occur: (module, class names, hint)
_ELSEWHERE = (
    ("hydra.errors", ("ConfigCompositionException", "MissingConfigException", "OverrideParseException"),
     _CONFIG_HINT),
    ("omegaconf.errors", ("OmegaConfBaseException",), _CONFIG_HINT),
    ("pipelines.execution.bundle", ("MissingInputError", "UntrustedManifestError"),
     "pass source.run_id=<a run of the stage that produces the input> (see 'A stage alone' in docs/PIPELINES.md)"),
    ("pipelines.orchestration.study", ("SearchSpaceError",), "check hydra.sweeper.params"),
    ("ortflow.exceptions", ("CheckpointError",), "see 'Checkpoints' in docs/PIPELINES.md"),
    ("pipelines.modeling.predictions", ("NonFinitePredictionError",),
     "the model diverged or the test data holds values far outside the training data: lower "
     "trainer.learning_rate, or check the named features"),
)


def hint_for(exc: BaseException) -> str | None:
    """The hint printed for an expected error; None when ``exc`` is not one (a bug: keep its traceback)."""
    if isinstance(exc, UserError):
        return exc.hint
    for module_name, names, hint in _ELSEWHERE:
        module = sys.modules.get(module_name)  # not imported: exc cannot be one of its classes
        if module is not None and isinstance(exc, tuple(getattr(module, n) for n in names)):
            return hint
    return None


def one_line(exc: BaseException) -> str:
    """``<Type>: <message>`` on one line; Hydra's composition errors also give their cause's message and key."""
    parts = [str(exc)]
    cause = exc.__cause__
    if cause is not None and type(exc).__module__.startswith("hydra"):
        parts.append(str(cause))
    text = " ".join(" ".join(line.strip() for line in part.split("Config search path")[0].splitlines()
                             if line.strip() and not line.strip().startswith(("object_type=", "reference_type=")))
                    for part in parts if part)
    return f"{type(exc).__name__}: {text}"


#: set (with HYDRA_FULL_ERROR=1) by :func:`hydra_raises`: that HYDRA_FULL_ERROR is ours, not the user's
_OURS = "ORTFLOW_HYDRA_FULL_ERROR"


def wants_traceback(argv: Sequence[str]) -> bool:
    """True when the user asked for tracebacks: ``ORTFLOW_TRACEBACK=1``, ``HYDRA_FULL_ERROR=1``, or
    ``debug=true`` or ``--verbose`` among the arguments."""
    if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
        return True
    if os.environ.get("HYDRA_FULL_ERROR", "") not in ("", "0") and not os.environ.get(_OURS):
        return True
    return any(arg.lstrip("+").lower() in ("debug=true", "debug=1", "debug=yes", "--verbose") for arg in argv)


def report(exc: BaseException, stream: TextIO | None = None) -> None:
    """Print an expected error: the problem (or, for an error holding several ``problems``, a line and one line
    per problem) and the hint."""
    stream = stream or sys.stderr
    problems = list(getattr(exc, "problems", None) or [])
    if len(problems) > 1:
        print(f"ortflow: error: {type(exc).__name__}: {len(problems)} problems", file=stream)
        for problem in problems:
            print(f"  - {problem}", file=stream)
    else:
        print(f"ortflow: error: {_without_append_advice(one_line(exc))}", file=stream)
    print(f"  hint: {_close_key_hint(exc)}{hint_for(exc) or UserError.hint}; debug=true shows the traceback",
          file=stream)


def _without_append_advice(line: str) -> str:
    """``line`` without Hydra's ``To append to your config use +trainer.max_iters=5`` for a key of a typed group
    (``Key 'max_iters' not in 'TrainerConfig'``): the checks refuse it (the schema takes no key it does not
    declare), so the project's did-you-mean (the hint) is the advice given."""
    import re

    if not re.search(r"not in '\w+Config'", line):
        return line
    return re.sub(r"To append to your config use \+\S+\s*", "", line)


def _close_key_hint(exc: BaseException) -> str:
    """``did you mean <key>?`` when Hydra refused a key the schema does not declare (``full_key: trainer.maxiter``)
    and the schema holds keys close to it (every one suggested exists)."""
    import re

    match = re.search(r"full_key: ([\w.]+)", f"{exc} {exc.__cause__ or ''}")
    if not match or "not in" not in f"{exc} {exc.__cause__ or ''}" or CLOSE_KEYS["find"] is None:
        return ""
    close = CLOSE_KEYS["find"](match[1])
    return f"did you mean {' or '.join(close)}? " if close else ""


#: ``find(key)``: the schema's keys close to ``key`` (set by :func:`pipelines.base.resolvers.register_configs`; this
#: module imports nothing of the config)
CLOSE_KEYS: dict = {"find": None}


@contextlib.contextmanager
def hydra_raises() -> Iterator[None]:
    """While the body runs, Hydra raises errors (HYDRA_FULL_ERROR=1) instead of printing its own report."""
    os.environ.update({"HYDRA_FULL_ERROR": "1", _OURS: "1"})
    try:
        yield
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)
        os.environ.pop(_OURS, None)


def exit_if_expected(exc: BaseException, argv: Sequence[str] = (), debug: bool = False) -> None:
    """Report ``exc`` and exit with :data:`USER_ERROR_STATUS` when it is an expected error and no traceback was
    asked for (``debug``, or :func:`wants_traceback` of ``argv``); return otherwise, for the caller to re-raise."""
    if debug or wants_traceback(argv) or hint_for(exc) is None:
        return
    report(exc)
    raise SystemExit(USER_ERROR_STATUS) from None


def exit_if_interrupted(exc: BaseException, argv: Sequence[str] = ()) -> None:
    """For Ctrl-C or SIGTERM (a KeyboardInterrupt): print one line naming the signal and the runs it ended, and
    exit with status 130 (SIGINT) or 143 (SIGTERM); return otherwise, or when a traceback was asked for
    (:func:`wants_traceback`), for the caller to re-raise."""
    if not isinstance(exc, KeyboardInterrupt) or wants_traceback(argv):
        return
    runs = list(getattr(exc, ENDED_RUNS_ATTR, None) or [])
    terminated = "SIGTERM" in str(exc)
    print(f"ortflow: interrupted ({'SIGTERM' if terminated else 'SIGINT, Ctrl-C'}): "
          + (f"runs ended: {', '.join(runs)}" if runs else "no run was open"), file=sys.stderr)
    raise SystemExit(143 if terminated else 130) from None
