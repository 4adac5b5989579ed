"""The ortflow objects a config describes, each built from its registry class (:mod:`ortflow.registry`) with the
settings that class takes, looked up by name in the config's groups: the loss (``loss`` only; with ``loss.name``
unset the estimator's own loss and settings), the penalty (``penalty``), the optimizer (``trainer``), and the
trainer's arguments (the trainer's table of parameters, :mod:`ortflow.trainers.parameters`). A new loss, penalty or optimizer
class in ortflow is usable here with nothing added. A setting its class does not take is a ConfigError naming it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

import ortflow
from ortflow.registry import family, names, select, settings_of

from .schema import (OPTIMIZER_SETTINGS, PIPELINE_SET, TRAINER_RENAMED, TRAINERS, ConfigError, TrainerConfig,
                     plain_value, task_of)


#: what an unset key means for a class that takes its parameter (else: the class's own default)
OPTIMIZER_DEFAULTS = {"lr_schedule": "constant"}
#: the ``trainer`` keys of a trainer parameter that the pipelines pass otherwise: ``verbose``
#: (:func:`trainer_verbose`)
NOT_TRAINER_KEYS = ("verbose",)


def optimizer_keys() -> dict[str, str]:
    """``trainer.<key>`` -> the optimizer parameter it sets: every constructor parameter of an optimizer of the
    registry when the schema was generated (:data:`pipelines.base.schema.OPTIMIZER_SETTINGS`)."""
    return {key: param for key, (param, _, _) in OPTIMIZER_SETTINGS.items()}


def trainer_keys() -> dict[str, str]:
    """``trainer.<key>`` -> the trainer parameter it sets: every key of the ``trainer`` group that names (through
    :data:`~pipelines.base.schema.TRAINER_RENAMED`) a parameter of a trainer's table
    (:data:`ortflow.trainers.parameters.TRAINERS`), but :data:`NOT_TRAINER_KEYS`. No registry needed."""
    from ortflow.trainers.parameters import TRAINERS as TABLES

    taken = {p.name for table in TABLES.values() for p in table} - set(PIPELINE_SET)
    return {key: TRAINER_RENAMED.get(key, key) for key in (f.name for f in fields(TrainerConfig))
            if key not in NOT_TRAINER_KEYS and TRAINER_RENAMED.get(key, key) in taken}


def settings_from(cls: type, groups: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """The settings of ``cls`` (its constructor's parameters, :func:`ortflow.registry.settings_of`) that the
    config's ``groups`` (name -> node) set, looked up by name, the first group first: parameter -> (the key that set
    it, its value). A key left None is unset: the class keeps its own default."""
    found: dict[str, tuple[str, Any]] = {}
    for group, node in groups.items():
        for param in settings_of(cls):
            if param not in found and param in node and node[param] is not None:
                value = node[param]
                value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else plain_value(value)
                found[param] = (f"{group}.{param}", value)
    return found


def _unknown_settings(group: str, node: DictConfig, cls: type, name: str, fixed: tuple = ("name",)) -> None:
    """The keys of ``group`` that are no setting of its class ``cls``: a ConfigError naming them and the class's."""
    taken = settings_of(cls)
    unknown = [f"{group}.{k}" for k in node if k not in fixed and k not in taken]
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: not a setting of {group}={name} ({cls.__name__} takes "
                          f"{taken or 'no setting'})")


def instance(kind: str, name: str, settings: dict[str, tuple[str, Any]], key: str) -> Any:
    """The registry's class ``name`` of family ``kind`` with ``settings`` (:func:`settings_from`), checked: a
    ConfigError naming the config's key of a bad value."""
    built = select(kind, name, key, **{param: value for param, (_, value) in settings.items()})
    try:
        built.check()
    except ValueError as exc:  # the message names the class's parameter: name the config's key instead
        keys = {param: where for param, (where, _) in settings.items()}
        message = re.sub(r"\b(\w+)=", lambda m: f"{keys[m[1]]}=" if m[1] in keys else m[0], str(exc))
        raise ConfigError(f"{key}={name}: {message}") from None
    return built


def loss_settings(cfg: DictConfig) -> dict[str, tuple[str, Any]]:
    """The settings of the chosen ``loss.name``, each parameter of its class from ``loss.<parameter>`` only: a
    model's setting of the same name (``model.alpha``, ``model.epsilon``) is the model's, never the loss's. A key of
    ``loss`` its class does not take is a ConfigError; so is any with ``loss.name`` unset (the model's own loss
    takes its settings from the estimator's record)."""
    name = cfg.loss.name
    if name is None:
        given = [f"loss.{k}" for k in cfg.loss if k != "name"]
        if given:
            raise ConfigError(f"{', '.join(given)}: settings of a loss, but loss.name is unset (the model's own loss, "
                              "whose settings are the fitted estimator's: model.epsilon, model.quantile...): choose "
                              "the loss with loss.name=<name> or loss=<option>")
        return {}
    cls = family("loss")[name]
    _unknown_settings("loss", cfg.loss, cls, name)
    return settings_from(cls, {"loss": cfg.loss})


def loss(cfg: DictConfig, graph: Any = None) -> ortflow.BaseLearningLoss:
    """The loss to train: ``loss.name`` from the registry with :func:`loss_settings`; ``loss.name`` unset, the
    model's own loss (:func:`ortflow.objectives.estimator_loss.own_loss`, what the core's trainers train with no loss named:
    the loss of the estimator ``graph`` records with the estimator's settings, HuberRegressor's epsilon and scale,
    QuantileRegressor's quantile...), and the task's :data:`ortflow.objectives.estimator_loss.DEFAULT_LOSS` for a graph without
    a record (model=onnx). The estimator's penalty is not taken: the ``penalty`` group names the penalty (``none`` by
    default), as ``add_loss_output``'s ``penalty=`` replaces the estimator's."""
    from ortflow.convert.sklearn import estimator_record
    from ortflow.objectives.estimator_loss import DEFAULT_LOSS, own_loss

    if cfg.loss.name is not None:
        return instance("loss", cfg.loss.name, loss_settings(cfg), "loss.name")
    loss_settings(cfg)
    if graph is None or not estimator_record(graph):
        return instance("loss", DEFAULT_LOSS[task_of(cfg)], {}, "loss.name")
    try:
        return own_loss(graph)
    except ValueError as exc:  # an estimator whose settings have no loss in ortflow (SGD's loss, Tweedie's link)
        raise ConfigError(f"model={plain_value(cfg.model.name)}: {exc}; choose the loss with loss.name=<name>") \
            from None


def penalty(cfg: DictConfig, weights: list[str] | None = None) -> ortflow.BaseLearningPenalty:
    """``penalty.name`` from the registry with the ``penalty`` settings its class takes (a key it does not take is
    a ConfigError naming it). ``weights``: the initializers of the graph trained; a class taking ``weights`` that
    the config leaves unset applies to the weight matrices among them (``coef`` of a linear model, ``coef_<i>`` of
    an MLP; not the intercepts). A named penalty that adds nothing with its settings is a ConfigError."""
    name = cfg.penalty.name
    cls = family("penalty")[name]
    _unknown_settings("penalty", cfg.penalty, cls, name)
    settings = settings_from(cls, {"penalty": cfg.penalty})
    if "weights" in settings_of(cls) and "weights" not in settings and weights is not None:
        settings["weights"] = ("penalty.weights", [n for n in weights if n == "coef" or n.startswith("coef_")])
    built = instance("penalty", name, settings, "penalty.name")
    if name != "none" and built.is_null():
        raise ConfigError(f"penalty={name} adds nothing with its settings ({built!r}): set them (penalty.l1, "
                          "penalty.l2, ...) or use penalty=none")
    return built


def learning_rate(cfg: DictConfig) -> ortflow.BaseLearningRate:
    """``trainer.optimizer`` from the registry, built with the ``trainer`` settings (:func:`optimizer_keys`) that
    were set and that its class takes; a set one that it does not take is a :class:`ConfigError` naming it."""
    t, name = cfg.trainer, plain_value(cfg.trainer.optimizer)
    if name not in names("optimizer"):
        raise ConfigError(f"trainer.optimizer={name!r} is not one of {names('optimizer')} (the names of "
                          "ortflow's registry)")
    taken, keys = settings_of(family("optimizer")[name]), optimizer_keys()
    settings = {}
    for key, param in keys.items():
        value = plain_value(t[key])
        if value is None and param in taken:
            value = OPTIMIZER_DEFAULTS.get(key)
        if value is None:
            continue
        if param not in taken:
            raise ConfigError(f"trainer.{key}={value}: trainer.optimizer={name} takes no {key} (its settings: "
                              f"{[k for k, p in keys.items() if p in taken]})")
        settings[param] = (f"trainer.{key}", value)
    return instance("optimizer", name, settings, "trainer.optimizer")


def trainer_table(cfg: DictConfig) -> tuple:
    from ortflow.trainers.parameters import TRAINERS as TABLES

    return TABLES[TRAINERS._names[plain_value(cfg.trainer.name)]]


def trainer_settings(cfg: DictConfig) -> dict[str, Any]:
    """The trainer's parameters set by the ``trainer`` group (:func:`trainer_keys`; no registry needed); a set key
    the chosen trainer does not take is a ConfigError."""
    t, name = cfg.trainer, plain_value(cfg.trainer.name)
    taken = {p.name for p in trainer_table(cfg)}
    args: dict[str, Any] = {}
    for key, param in trainer_keys().items():
        value = t[key]
        if value is None:  # unset: the trainer's own default
            continue
        if param not in taken:
            raise ConfigError(f"trainer.{key}={plain_value(value)}: trainer={name} takes no {key}")
        args[param] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else plain_value(value)
    return args


def trainer_arguments(cfg: DictConfig, callbacks: list | None = None) -> dict[str, Any]:
    """The estimator's parameters from ``trainer``, except the graph, the loss and the penalty (they need the
    graph: :func:`adds_loss`)."""
    args = trainer_settings(cfg)
    args.update(learning_rate=learning_rate(cfg), verbose=trainer_verbose(cfg), callbacks=callbacks or [], exc=True)
    return args


def adds_loss(cfg: DictConfig) -> bool:
    """Whether ``trainer.name`` adds the loss and penalty itself (``learning_loss``), else it trains the graph
    ``add_loss`` wrote."""
    return any(p.name == "learning_loss" for p in trainer_table(cfg))


def trainer_verbose(cfg: DictConfig) -> int:
    """``trainer.verbose``, or when it is None 1 (ortflow's progress bar over epochs) if stdout is a terminal and
    0 otherwise: a bar for a person at a terminal, clean logs for jobs, CI and pipes."""
    import sys

    verbose = cfg.trainer.verbose
    return int(verbose) if verbose is not None else int(sys.stdout.isatty())
