"""``mlflow run`` entry: ``python -m pipelines.mlproject <stage> <overrides>``; ``--write`` regenerates MLproject.

``python -m pipelines.mlproject run [URI] [options]`` is ``mlflow run`` guarded (:func:`run_project`): MLflow makes
its run, then builds python_env.yaml's environment, and leaves the run RUNNING with a traceback when that fails.

``MLproject``'s entry points are ``main`` and one per stage of the table (pipelines/base/stages.py), each
running this module: ``python -m pipelines.mlproject --write`` writes them from the table (:func:`mlproject_text`;
a test checks the committed file is what the table gives).

MLflow quotes each ``-P`` value as one shell word, so ``-P overrides="trainer=fwbw trainer.max_iter=5"`` reaches
the command as a single argument; this splits such arguments back into Hydra overrides and runs the stage's
Hydra app (which finds MLFLOW_RUN_ID and logs into mlflow run's run). The app checks the overrides first
(:mod:`pipelines.overrides`): a caller of ``mlflow run`` picks values, never code (``_target_``, callbacks).

``mlflow run .`` given no ``--experiment-name``/``--experiment-id`` creates its run in MLflow's Default experiment
(id 0) before the project starts. The pipelines then log where ``python -m pipelines.main`` logs
(``mlflow.experiment_name``, ``ortflow`` by default), in runs of their own linked to mlflow run's run by tags
(:func:`pipelines.tracking.link_mlflow_run`); with an experiment named, they log into mlflow run's run.

Every entry point declares one parameter, ``overrides``, and takes any key of the config schema as a ``-P`` too:
``mlflow run . -P trainer.max_iter=5 -P data=iris`` (MLflow records the key as a parameter of its run, then
appends ``--trainer.max_iter 5`` to the command; :func:`accepted_parameters` turns each such pair into the Hydra
override ``trainer.max_iter=5``, after those of ``overrides``). A key that is neither a key of the schema
(:func:`pipelines.base.schema.schema_keys`), a config group (``data``, ``experiment``...) nor a ``hydra`` key is
refused before anything runs (:class:`MlflowRunParameterError`: one line naming it, the schema keys close to it,
status 2), and since MLflow offers no way to refuse it before its run exists, mlflow run's run is marked
(:func:`pipelines.tracking.mark_refused_mlflow_run`: named ``refused-parameters``, FAILED, the reason as its
description), so it cannot read as a run of those settings. It cannot be deleted: mlflow run ends its run itself
once the command exits, and fails with a traceback when that run is deleted.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from .base.handoff import OUTER_RUN_ENV
from .cli import CHAIN, app
from .base.errors import USER_ERROR_STATUS, UserError, exit_if_interrupted, report
from .base.stages import names

#: the MLproject file, at the repository root
MLPROJECT = Path(__file__).resolve().parent.parent / "MLproject"
_HEADER = """\
# mlflow run . --env-manager local -P overrides="trainer=fwbw trainer.max_iter=5"
# mlflow run . -e train --env-manager local -P source.run_id=<an add_loss run> -P trainer.max_iter=50
# Every entry point takes Hydra overrides as one string (overrides) and any key of the config as -P key=value;
# the chain and each stage log into mlflow run's run. Without --env-manager local, MLflow builds python_env.yaml's
# environment (pyenv, network) after making its run: `python -m pipelines.mlproject run . [options]` refuses first
# when it cannot, and ends the run FAILED when building fails.
# Written by `python -m pipelines.mlproject --write` from the stage table (pipelines/base/stages.py).
name: ortflow

python_env: python_env.yaml

entry_points:
"""
#: MLflow's Default experiment, where ``mlflow run`` puts its run when it was given no experiment
DEFAULT_EXPERIMENT_ID = "0"


def own_experiment(environ: dict = os.environ) -> None:  # noqa: B006 - the process environment, on purpose
    """Under ``mlflow run`` given no experiment: hide its Default experiment and run from the pipelines (they log
    into ``mlflow.experiment_name``) and keep the run's id in :data:`OUTER_RUN_ENV`, to be linked."""
    if (environ.get("MLFLOW_RUN_ID") and environ.get("MLFLOW_EXPERIMENT_ID") == DEFAULT_EXPERIMENT_ID
            and not environ.get("MLFLOW_EXPERIMENT_NAME")):
        environ[OUTER_RUN_ENV] = environ.pop("MLFLOW_RUN_ID")
        environ.pop("MLFLOW_EXPERIMENT_ID")


class MlflowRunParameterError(UserError, ValueError):
    """``mlflow run -P <key>=<value>`` with a key that is not one of the config's; the message names it."""

    hint = ("mlflow run . -P key=value takes the keys of the config (python -m pipelines.main --cfg job lists "
            "them) and config groups (-P data=iris); -P overrides=\"key=value ...\" takes any Hydra override")


def is_config_key(key: str) -> bool:
    """Whether ``-P key=value`` names a key of the config schema (or a key inside one of its dicts, such as
    ``mlflow.tags.team``), a config group (``data``, ``hydra/launcher``) or a ``hydra.`` key; the overrides
    guard (:mod:`pipelines.overrides`) still checks what they hold."""
    from .base.schema import schema_keys
    from .overrides import _GROUPS

    keys = schema_keys()
    return (key in keys or any(key.startswith(f"{k}.") for k in keys) or key in _GROUPS
            or key.startswith(("hydra.", "hydra/")))


def accepted_parameters(stage: str, argv: list[str], environ: dict = os.environ) -> list[str]:  # noqa: B006
    """Under ``mlflow run`` (``MLFLOW_RUN_ID`` set), ``argv`` is ``[overrides, --key, value, ...]``: MLflow appends
    a ``--key value`` pair for each ``-P`` key the entry point does not declare. The Hydra overrides they give
    (``key=value``), when every key is one of the config's; otherwise refuse them all, after marking the run
    mlflow run made with them (see the module's docstring)."""
    run_id = environ.get("MLFLOW_RUN_ID")
    if not run_id or len(argv) <= 1:
        return []
    extra = argv[1:]
    if not all(key.startswith("--") for key in extra[::2]):  # not what mlflow run writes: left to the guard
        return []
    pairs = [(key[2:], value) for key, value in zip(extra[::2], extra[1::2] + [""] * (len(extra) % 2))]
    unknown = [key for key, _ in pairs if not is_config_key(key)]
    from .base.schema import close_keys, schema_keys

    if not unknown:  # a key inside one of the schema's dicts (mlflow.tags.team) is added: ++
        keys = set(schema_keys())
        return [f"{'' if key in keys or '.' not in key or key.startswith('hydra') else '++'}{key}={value}"
                for key, value in pairs]
    close = sorted({c for key in unknown for c in close_keys(key, schema_keys())})
    error = MlflowRunParameterError(
        f"mlflow run -P {' -P '.join(f'{k}={v}' for k, v in pairs if k in unknown)}: "
        f"{', '.join(map(repr, unknown))} {'is not a key' if len(unknown) == 1 else 'are not keys'} of the config"
        + (f" (did you mean {' or '.join(close)}?)" if close else ""))
    try:
        from .tracking import REFUSED_RUN_NAME, mark_refused_mlflow_run

        mark_refused_mlflow_run(run_id, f"{type(error).__name__}: {error}")
        error.args = (f"{error}; nothing ran: mlflow run's run {run_id} is named {REFUSED_RUN_NAME!r}",)
    except Exception as exc:  # noqa: BLE001 - the refusal is what the user must see
        error.args = (f"{error}; mlflow run's run {run_id} could not be marked ({type(exc).__name__}: {exc})",)
    report(error)
    raise SystemExit(USER_ERROR_STATUS)


class EnvironmentBuildError(UserError, RuntimeError):
    """``mlflow run`` cannot build the project's environment (python_env.yaml) here; the message says why."""

    hint = ("--env-manager local runs the project in the environment `make run` set up (source .venv/bin/activate "
            "first); see '`mlflow run`' in docs/PIPELINES.md")


def _option(argv: list[str], name: str) -> str | None:
    """The value of ``--name value`` or ``--name=value`` in ``argv`` (None when absent)."""
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(f"{name}="):
            return word.split("=", 1)[1]
    return None


def environment_problem(project: Path, env_manager: str | None) -> str | None:
    """Why ``mlflow run`` could not build ``project``'s python_env.yaml environment with ``env_manager`` (None:
    MLflow's default, virtualenv) without downloading an interpreter; None when it can (or builds none)."""
    import shutil
    import subprocess

    import yaml

    env_file = project / "python_env.yaml"
    if env_manager not in (None, "virtualenv") or not env_file.exists():
        return None
    python = str(yaml.safe_load(env_file.read_text()).get("python", ""))
    pyenv = shutil.which("pyenv")
    if pyenv is None:
        return (f"{env_file} asks for Python {python}, and mlflow run's default environment manager (virtualenv) "
                "builds it with pyenv, which is not installed")
    installed = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True, timeout=60).stdout
    if not any(v == python or v.startswith(f"{python}.") for v in installed.split()):
        return (f"{env_file} asks for Python {python}, which pyenv has not installed: mlflow run's default "
                f"environment manager (virtualenv) would download and build Python {python}'s newest release "
                f"(network, minutes), or fail; pyenv install {python} first")
    return None


def run_project(argv: list[str]) -> None:
    """``python -m pipelines.mlproject run [URI] [mlflow run's options]``: ``mlflow run``, which fails before any
    run when the environment cannot be built here (:func:`environment_problem`), and ends mlflow run's run FAILED
    with the reason when building it fails later (MLflow leaves it RUNNING: it makes the run first)."""
    from .tracking import failure_reason, run_mlflow_project

    uri, rest = (argv[0], argv[1:]) if argv[:1] and not argv[0].startswith("-") else (".", argv)
    problem = environment_problem(Path(uri), _option(argv, "--env-manager"))
    if problem:
        raise EnvironmentBuildError(f"mlflow run {uri}: {problem}; no run was made")
    try:
        run_mlflow_project(uri, rest)
    except Exception as exc:  # noqa: BLE001 - MLflow's environment build failed: its run was ended FAILED
        ended = getattr(exc, "ended_runs", [])
        raise EnvironmentBuildError(f"mlflow run {uri}: {build_failure(failure_reason(exc))}"
                                    + (f"; its run {', '.join(ended)} ended FAILED" if ended else "")
                                    + f"; what works here: {local_command(uri, rest)}") from exc


def build_failure(reason: str) -> str:
    """What failed, from the reason of MLflow's exception: its first line and, for a command MLflow ran (its
    ``ShellCommandException`` holds ``Command: [...]`` and the command's output), that command and its last line
    of output (MLflow's own message is ``Non-zero exit code: 1`` and no more)."""
    lines = reason.splitlines()
    command = next((line[len("Command: "):] for line in lines if line.startswith("Command: ")), None)
    if command is None:
        return lines[0] if lines else reason
    said = [line.strip() for line in lines[lines.index(f"Command: {command}") + 1:]
            if line.strip() and line.strip() not in ("STDOUT:", "STDERR:")]
    return (f"building the project's environment failed: {lines[0]} from {command}"
            + (f", which said: {said[-1]}" if said else ""))


def local_command(uri: str, rest: list[str]) -> str:
    """The same ``python -m pipelines.mlproject run`` in the environment of this process (``--env-manager local``)."""
    kept, skip = [], False
    for word in rest:
        if skip:
            skip = False
        elif word == "--env-manager":
            skip = True
        elif not word.startswith("--env-manager="):
            kept.append(word)
    return shlex.join(["python", "-m", "pipelines.mlproject", "run", uri, "--env-manager", "local", *kept])


def entry_points() -> tuple[str, ...]:
    """``main`` (the chain), then the stages of the table."""
    return (CHAIN, *names())


def mlproject_text() -> str:
    """The MLproject file the stage table gives: one entry point per :func:`entry_points`."""
    return _HEADER + "".join(
        f"  {name}:\n    parameters:\n      overrides: {{type: string, default: \"\"}}\n"
        f"    command: \"python -m pipelines.mlproject {name} {{overrides}}\"\n" for name in entry_points())


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--write"]:
        MLPROJECT.write_text(mlproject_text())
        print(f"wrote {MLPROJECT} ({', '.join(entry_points())})")
        return
    usage = (f"usage: python -m pipelines.mlproject {{{','.join(entry_points())}}} [overrides ...] | --write | "
             "run [URI] [mlflow run's options]")
    if argv[:1] in (["-h"], ["--help"]):
        print(f"{usage}\n\n{__doc__.strip()}")
        return
    if argv[:1] == ["run"]:
        try:
            run_project(argv[1:])
        except UserError as exc:
            report(exc)
            raise SystemExit(USER_ERROR_STATUS) from None
        except KeyboardInterrupt as exc:
            exit_if_interrupted(exc, argv)
            raise
        return
    if not argv or argv[0] not in entry_points():
        print(usage, file=sys.stderr)
        raise SystemExit(2)
    parameters = accepted_parameters(argv[0], argv[1:])
    given = argv[1:2] if parameters else argv[1:]  # the overrides string (and, outside mlflow run, any words)
    stage, rest = argv[0], [*(word for arg in given for word in shlex.split(arg)), *parameters]
    own_experiment()
    sys.argv = [f"pipelines.{stage}", *rest]
    app(stage)()


if __name__ == "__main__":
    main()
