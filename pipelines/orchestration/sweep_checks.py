"""What a ``-m`` sweep is checked for before any trial, and the metric that chooses its best trial.

- ``optimized_metric`` names a metric the chain writes for the task (a loss of ``train`` or a metric of
  ``evaluate``, the stage running), with a did-you-mean (a typo would fail every trial, ``test_msee = None``);
- a swept ``model.<key>`` is a setting of every model the sweep trains (``model.hidden_layer_sizes`` with
  ``model=linear`` would search nothing: each trial trains the same model);
- when the trials train models with different losses (``model=linear,huber,mlp_regressor``, a swept ``loss``) and
  ``optimized_metric`` is a loss (``validation_loss``: each model's own), the best trial is chosen on the task's
  metric of the validation rows, which every model shares (:func:`pipelines.base.metric_names.shared_metric`:
  ``validation_mse``, ``validation_log_loss``), and the sweep says so.

:func:`check_sweep` runs in the launching process when the sweep starts (the sweep callback's
``on_multirun_start``, before its MLflow run); Optuna's sweeper asks :func:`selection` for the value its trials
return.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from ..base import metric_names as mn
from ..base.schema import TASK_MODEL, ConfigError, close_keys, plain_value
from ..base.models import BY_NAME
from .study import Dimension, SearchSpaceError, parse_space

#: the keys of ``cfg.model`` every model reads (the others: :attr:`pipelines.base.models.Model.settings`)
MODEL_COMMON = ("name", "task", "target_opset")
#: ``model=onnx``'s own keys
ONNX_KEYS = ("path", "output")
#: the search space of each model kind (``conf/hparams_search/<file>.yaml``): the models with a network search its
#: shape, the others the trainer's settings only
SEARCH_SPACES = {"mlp_regressor": "optuna_mlp", "mlp_classifier": "optuna_mlp"}
DEFAULT_SEARCH_SPACE = "optuna"
#: swept keys that change the loss the trials train (their ``validation_loss`` then do not compare): the loss and
#: penalty groups, and the model settings its loss takes
LOSS_GROUPS = ("loss", "penalty")
MODEL_LOSS_KEYS = ("model.epsilon", "model.quantile", "model.sgd_loss")


@dataclass(frozen=True)
class Selection:
    """The metric that chooses the sweep's best trial and its direction; ``why``: a line when it is not
    ``optimized_metric`` (the trials train different losses)."""

    metric: str
    direction: str
    why: str | None = None


def swept(config: DictConfig) -> list[Dimension]:
    """The sweep's dimensions: ``hydra.sweeper.params`` and the sweep overrides of the command line (none that
    cannot be described, e.g. a ``glob()``)."""
    try:
        dimensions, _ = parse_space(_plain(config.hydra.sweeper.get("params")), list(config.hydra.overrides.task))
    except SearchSpaceError:
        return []
    return dimensions


def _plain(node):
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def _task(config: DictConfig) -> str:
    return str(plain_value(config.data.task))


def sweep_models(config: DictConfig, dimensions: list[Dimension]) -> list[str]:
    """The ``model.name`` of every trial: a swept ``model``/``model.name``'s choices, else the one composed (or the
    one ``data.task`` implies when ``model=`` is left out)."""
    for d in dimensions:
        if d.key in ("model", "model.name"):
            return [str(c) for c in d.distribution.choices]
    name = OmegaConf.select(config, "model.name")
    return [str(plain_value(name)) if name is not None else TASK_MODEL[_task(config)]]


def check_optimized_metric(metric: str, task: str, stages: list[str]) -> None:
    """``optimized_metric`` names a metric the chain writes for ``task``, and its stage runs (a did-you-mean for a
    typo); a ConfigError otherwise."""
    names = mn.optimizable(task)
    if not mn.is_metric(metric, task) and metric not in mn.LOSSES:
        close = close_keys(metric, names)
        raise ConfigError(f"optimized_metric={metric!r} is not a metric the chain writes for a {task} task: one of "
                          f"{names}" + (f"; did you mean {' or '.join(f'optimized_metric={c}' for c in close)}?"
                                        if close else ""))
    stage = "train" if metric in mn.LOSSES else "evaluate"
    if stage not in stages:
        raise ConfigError(f"optimized_metric={metric} is written by stage {stage}, which stages={stages} does not "
                          f"run: every trial would return nothing")


def check_search_space(models: list[str], dimensions: list[Dimension]) -> None:
    """Every swept ``model.<key>`` is a setting of every model the sweep trains; a ConfigError naming the key, the
    models that ignore it and the search space for them otherwise."""
    problems = []
    for d in dimensions:
        if not d.key.startswith("model.") or d.key == "model.name":
            continue
        key = d.key[len("model."):]
        ignore = [m for m in models if m in BY_NAME and key not in
                  (*MODEL_COMMON, *BY_NAME[m].settings, *(ONNX_KEYS if m == "onnx" else ()))]
        if ignore:
            spaces = sorted({SEARCH_SPACES.get(m, DEFAULT_SEARCH_SPACE) for m in ignore})
            takes = sorted(m for m, model in BY_NAME.items() if key in model.settings)
            problems.append(
                f"the sweep searches {d.key} but model={','.join(ignore)} does not use it (its settings: "
                f"{', '.join(BY_NAME[ignore[0]].settings)}): every value would train the same model; search "
                f"that model's space ({' or '.join(f'hparams_search={s}' for s in spaces)})"
                + (f", or pick a model that uses {key} ({', '.join(takes)})" if takes else ""))
    if problems:
        raise ConfigError.of(problems)


def selection(config: DictConfig, dimensions: list[Dimension] | None = None) -> Selection:
    """The metric that chooses the best trial: ``optimized_metric``, unless it is a loss and the trials train
    different losses (several models, a swept loss or penalty): then the task's shared validation metric."""
    metric = str(config.optimized_metric)
    dimensions = swept(config) if dimensions is None else dimensions
    direction = config.hydra.sweeper.get("direction")
    own = Selection(metric, str(direction) if direction else mn.direction(metric))
    if metric not in mn.LOSSES:
        return own
    models = sweep_models(config, dimensions)
    losses = [d.key for d in dimensions if d.key.split(".")[0] in LOSS_GROUPS or d.key in MODEL_LOSS_KEYS]
    if len(models) == 1 and not losses:
        return own
    shared = mn.shared_metric(_task(config))
    what = f"different models ({', '.join(models)})" if len(models) > 1 else f"different losses ({', '.join(losses)})"
    return Selection(shared, mn.direction(shared),
                     f"the trials train {what}: their {metric} is each one's own loss, which does not compare; the "
                     f"best trial is chosen on {shared} (the task's metric on the validation rows), which they "
                     "share")


def check_sweep(config: DictConfig) -> Selection:
    """Every check of a sweep before its first trial (a ConfigError listing each problem); the metric that will
    choose its best trial."""
    task = _task(config)
    stages = [str(s) for s in config.stages]
    dimensions = swept(config)
    problems = []
    for check, args in ((check_optimized_metric, (str(config.optimized_metric), task, stages)),
                        (check_search_space, (sweep_models(config, dimensions), dimensions))):
        try:
            check(*args)
        except ConfigError as exc:
            problems.extend(exc.problems)
    direction = config.hydra.sweeper.get("direction")
    metric = str(config.optimized_metric)
    if direction and not problems and str(direction) != mn.direction(metric):
        problems.append(f"optimized_metric={metric} is {mn.direction(metric)}d but hydra.sweeper.direction="
                        f"{direction}: the sweep would look for the worst trial; set hydra.sweeper.direction="
                        f"{mn.direction(metric)}")
    chosen = selection(config, dimensions) if not problems else None
    if chosen is not None and chosen.why is not None:
        if "evaluate" not in stages:
            problems.append(f"{chosen.why}; it is written by stage evaluate, which stages={stages} does not run")
        elif float(config.data.validation_fraction) <= 0:
            problems.append(f"{chosen.why}; it needs validation rows: data.validation_fraction > 0")
    if problems:
        raise ConfigError.of(problems)
    return chosen


__all__ = ["Selection", "swept", "sweep_models", "check_optimized_metric", "check_search_space", "selection",
           "check_sweep", "SEARCH_SPACES"]
