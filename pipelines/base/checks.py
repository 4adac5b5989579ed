"""The checks of a composed config, run once per command by :func:`validate`, when it starts and before any stage or
MLflow run: keys added past the schema (``+trainer.foo=1``), the registry names (listing the registry takes seconds
of imports, composing does not wait), each setting against the part it belongs to (a loss, penalty or optimizer
setting its class does not take, the trainer's settings against the trainer's table of parameters in
:mod:`ortflow.trainers.parameters`), rules that involve several groups (a classifier with a regression loss, ...) and
``promotion.metric`` against the task's metrics. Every problem found is reported at once.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

from omegaconf import DictConfig, OmegaConf

from ortflow.registry import family, names

from .builders import learning_rate, loss, loss_settings, penalty, trainer_keys, trainer_settings, trainer_table
from .schema import (ARRAY_LOADERS, COLUMN_TREATMENTS, CONFIG_DIR, DATA_NAME, MODEL_TASK, TASK_MODEL, Config,
                     ConfigError, DataKind, ModelKind, PreprocessKind, Task, close_keys, data_loader, follow_task,
                     plain_value, schema_keys)
from .models import BY_NAME
from .stages import names as stage_names


# loss.name, penalty.name and trainer.optimizer hold names of the core's registry: a loss, penalty or learning
# rate registered in ortflow is a valid choice. They are plain strings in the schema, checked by validate():
# listing the registry imports scikit-learn and onnxruntime (seconds), which composing the config must not wait
# for (a data problem is reported before that).
REGISTRY_KEYS = {"loss.name": "loss", "penalty.name": "penalty", "trainer.optimizer": "optimizer"}
#: the configs :func:`validate` passed in this process, as YAML
_VALIDATED: set[str] = set()


def validate(cfg: DictConfig) -> None:
    """Every check of the settings, once, before any stage runs: keys outside the schema, cross-group rules that
    a per-key type cannot express, the registry names (:data:`REGISTRY_KEYS`), the trainer's settings against its
    table of parameters (:func:`check_trainer`) and ``promotion.metric`` against the task's metrics. ``model`` and
    ``model`` left unchosen first gets the option of ``data.task`` (:func:`follow_task`). Every problem found is
    reported in one :class:`ConfigError` (its ``problems``), not the first only. A config validated already in
    this process (the same text) is not checked again: a command validates once, however many of its steps ask."""
    follow_task(cfg)
    text = OmegaConf.to_yaml(cfg)
    if text in _VALIDATED:
        return
    problems: list[str] = []

    def check(fn: Any, *args: Any) -> bool:
        try:
            fn(*args)
        except ConfigError as exc:
            problems.extend(p for p in exc.problems if p not in problems)
            return False
        return True

    check(check_known_keys, cfg)
    check(validate_data, cfg.data)
    check(check_promotion_metric, cfg.promotion.metric, plain_value(cfg.data.task))
    trainer_ok = check(check_trainer, cfg, False)  # first the checks that need no registry (seconds of imports)
    registry_ok = {kind: check(_check_registry_name, cfg, key, kind) for key, kind in REGISTRY_KEYS.items()}
    check(check_task, cfg, registry_ok["loss"])
    if registry_ok["loss"]:
        check(check_loss, cfg)
    if registry_ok["penalty"]:
        check(penalty, cfg)
    if trainer_ok and all(registry_ok.values()):
        check(check_trainer, cfg)
    check(_check_values, cfg)
    check(check_stages, cfg.stages)
    check(check_preprocess, cfg.preprocess)
    if problems:
        raise ConfigError.of(problems)
    _VALIDATED.add(text)


def validate_data(data: DictConfig) -> None:
    """The checks of the ``data`` group alone: a loader, a path and a target for a table, a usable name."""
    loader = data_loader(data)
    if loader == DataKind.file.value and any(OmegaConf.is_missing(data, k) or not data[k] for k in ("path", "target")):
        raise ConfigError("data=file needs data.path (a .csv or .parquet file) and data.target (the label column)")
    if loader == DataKind.parquet.value:
        if any(OmegaConf.is_missing(data, k) or not data[k] for k in ("path", "target")):
            raise ConfigError("data=parquet needs data.path (a Parquet file or a folder of them) and data.target "
                              "(the label column)")
        if data.sample_rows < 2 or data.buffer_rows < 1:
            raise ConfigError(f"data.sample_rows={data.sample_rows} must be >= 2 and data.buffer_rows="
                              f"{data.buffer_rows} >= 1")
        if not data.test_size + data.validation_fraction < 1:
            raise ConfigError(f"data.test_size={data.test_size} + data.validation_fraction="
                              f"{data.validation_fraction} must stay below 1: the rest is the training part")
    if loader in ARRAY_LOADERS and (data.standardize or data.standardize_target):
        raise ConfigError(f"data.loader={loader} gives arrays (images, tokens) that are never standardized: "
                          "leave data.standardize and data.standardize_target false")
    if not DATA_NAME.match(str(data.name)):
        raise ConfigError(f"data.name={data.name!r} names the runs and the registered model: use letters, "
                          "digits, '_', '.' and '-' (at most 100, starting with a letter or digit)")


def check_known_keys(cfg: DictConfig) -> None:
    """A key the schema does not declare (``+trainer.foo=1`` adds one past the schema) is a ConfigError naming it."""
    types = get_type_hints(Config)
    for group, schema in (("", Config), *((f + ".", t) for f, t in types.items() if is_dataclass(t))):
        node = OmegaConf.select(cfg, group[:-1]) if group else cfg
        if not isinstance(node, DictConfig):
            continue
        declared = {f.name for f in fields(schema)}
        unknown = [f"{group}{k}" for k in node.keys() if k not in declared]
        if unknown:
            close = [c for k in unknown for c in close_keys(k, schema_keys())]
            raise ConfigError(f"{', '.join(unknown)}: not a setting of the config (the keys of {group[:-1] or 'the root'}"
                              f": {sorted(declared)})" + (f"; did you mean {' or '.join(close)}?" if close else ""))


def _check_registry_name(cfg: DictConfig, key: str, kind: str) -> None:
    value = OmegaConf.select(cfg, key)
    if value is None and kind == "loss":  # the model's own loss
        return
    if value not in names(kind):
        close = close_keys(str(value), names(kind))
        raise ConfigError(f"{key}={value!r} is not one of {names(kind)} (the names of ortflow's registry)"
                          + (f"; did you mean {' or '.join(f'{key}={c}' for c in close)}?" if close else ""))


def check_task(cfg: DictConfig, loss_known: bool = True) -> None:
    """``model`` and ``loss`` against ``data.task``: a contradictory choice is a ConfigError naming both sides
    (``loss_known``: ``loss.name`` is a registry name, else its task is not checked)."""
    data_task = Task(plain_value(cfg.data.task))
    data = f"data={plain_value(cfg.data.name)}" + (f" (data.task={data_task.value})"
                                                if plain_value(cfg.data.name) != data_task.value else "")
    problems = []
    model = ModelKind(plain_value(cfg.model.name))
    if model == ModelKind.onnx:  # the user's graph takes the data's task; its outputs are checked against the data
        if plain_value(cfg.model.task) != data_task.value:
            problems.append(f"model.task={plain_value(cfg.model.task)} does not match data.task={data_task.value} "
                            "(model=onnx follows the data: leave model.task out)")
        loader = data_loader(cfg.data)
        if (loader in (DataKind.file.value, DataKind.parquet.value)
                and str(cfg.preprocess.name) != PreprocessKind.none.value):
            problems.append(f"model=onnx trains on numeric arrays: with data={loader} use preprocess=none (the graph "
                            "takes the standardized numeric columns)")
        if OmegaConf.is_missing(cfg.model, "path") or not cfg.model.path:
            problems.append("model=onnx needs model.path: the .onnx file of the graph to train")
    elif MODEL_TASK[model] != data_task:
        fitting = [m.value for m, t in MODEL_TASK.items() if t == data_task]
        problems.append(f"model={model.value} is a {MODEL_TASK[model].value} model but {data} is a "
                        f"{data_task.value} data set: pick {choice_hint('model', fitting)}, or leave model= out "
                        f"(it follows data.task: model={TASK_MODEL[data_task.value]})")
    elif plain_value(cfg.model.task) != data_task.value:
        problems.append(f"model.task={plain_value(cfg.model.task)} does not match data.task={data_task.value}")
    if BY_NAME[model.value].log_link and cfg.data.standardize_target:
        problems.append(f"model={model.value} predicts exp(score), a count or rate: its target must keep its units "
                        "(data.standardize_target=false)")
    if loss_known and cfg.loss.name is not None:
        classes = family("loss")
        task = classes[cfg.loss.name].task
        if task != data_task.value:
            fitting = sorted({c.names[0] for c in classes.values() if c.task == data_task.value})
            problems.append(f"loss={plain_value(cfg.loss.name)} is a {task} loss but {data} is a "
                            f"{data_task.value} data set: use {choice_hint('loss', fitting)}, or leave loss= out "
                            "(the model's own loss)")
    if problems:
        raise ConfigError.of(problems)


def choice_hint(group: str, names_fitting: list[str]) -> str:
    """How to pick each of ``names_fitting``: ``group=<option>`` where ``conf/<group>/<option>.yaml`` exists,
    else ``<group>.name=<name>`` (a registry name with no file of its own is not a valid ``group=`` choice)."""
    options = {p.stem for p in (Path(CONFIG_DIR) / group).glob("*.yaml")}
    files = [f"{group}={n}" for n in names_fitting if n in options]
    others = [n for n in names_fitting if n not in options]
    return " or ".join(files + ([f"{group}.name=<one of {others}>"] if others else []))


def check_loss(cfg: DictConfig) -> None:
    """The ``loss`` group: its keys against the settings its class takes, their values against the class's checks
    (a model's own loss is checked when its estimator is known, by ``add_loss``)."""
    if cfg.loss.name is None:
        loss_settings(cfg)
    else:
        loss(cfg)


def check_trainer(cfg: DictConfig, registry: bool = True) -> None:
    """The trainer's settings checked once, against the trainer's own table of parameters
    (:data:`ortflow.trainers.parameters.TRAINERS`): a ConfigError naming the ``trainer`` key. ``registry=False`` checks
    those that need no registry look-up (they fail in a fraction of a second, scikit-learn not imported)."""
    args = trainer_settings(cfg)
    if registry:
        args["learning_rate"] = learning_rate(cfg)
    keys = {param: key for key, param in trainer_keys().items()}
    for param in trainer_table(cfg):
        if param.name not in args or param.check is None:
            continue
        key = f"trainer.{keys.get(param.name, param.name)}"
        try:
            param.check(key, args[param.name])
        except (ValueError, TypeError, ImportError) as exc:
            message = str(exc).splitlines()[0]
            raise ConfigError(message if key in message else f"{key}={args[param.name]}: {message}") from None


def _check_values(cfg: DictConfig) -> None:
    """The numeric ranges of ``data`` and ``mlflow``."""
    problems = []
    for key in ("data.test_size", "data.validation_fraction"):
        value = OmegaConf.select(cfg, key)
        if not 0.0 <= value < 1.0:
            problems.append(f"{key}={value} must be in [0, 1)")
    if not 0.0 < cfg.data.test_size:
        problems.append("data.test_size must be > 0: evaluate needs a test split")
    if cfg.mlflow.metrics_flush_every < 0 or cfg.mlflow.metrics_flush_seconds <= 0:
        problems.append("mlflow.metrics_flush_every must be >= 0 and mlflow.metrics_flush_seconds > 0")
    if cfg.mlflow.retry_seconds <= 0 or cfg.mlflow.connect_timeout <= 0:
        problems.append("mlflow.retry_seconds and mlflow.connect_timeout must be > 0")
    if cfg.promotion.min_relative_improvement < 0 or cfg.promotion.min_absolute_improvement < 0:
        problems.append("promotion.min_relative_improvement and promotion.min_absolute_improvement must be >= 0")
    if cfg.mlflow.retries < 1:
        problems.append(f"mlflow.retries={cfg.mlflow.retries} must be >= 1")
    if cfg.data.n_samples < 10 or cfg.data.n_features < 1:
        problems.append(f"data.n_samples={cfg.data.n_samples} must be >= 10 and data.n_features >= 1")
    if cfg.data.vocab_size < 2:
        problems.append(f"data.vocab_size={cfg.data.vocab_size} must be >= 2")
    every_rows = cfg.trainer.checkpoint_every_rows
    if every_rows is not None:
        if every_rows < 1:
            problems.append(f"trainer.checkpoint_every_rows={every_rows} must be a positive number of rows")
        if plain_value(cfg.data.loader) != DataKind.parquet.value or cfg.trainer.checkpoint_every < 1:
            problems.append(f"trainer.checkpoint_every_rows={every_rows}: checkpoints inside an epoch are for a "
                            "streamed table (data=parquet) with trainer.checkpoint_every >= 1; an in-memory "
                            "epoch checkpoints at its end")
    if problems:
        raise ConfigError.of(problems)


def check_preprocess(preprocess: DictConfig) -> None:
    """Each ``preprocess.columns.<column>`` names a treatment of :data:`COLUMN_TREATMENTS`."""
    bad = {str(k): str(v) for k, v in (preprocess.get("columns") or {}).items() if str(v) not in COLUMN_TREATMENTS}
    if bad:
        raise ConfigError(f"preprocess.columns {bad}: each column's treatment is one of {list(COLUMN_TREATMENTS)}")


def check_promotion_metric(metric: str | None, task: str) -> None:
    """``promotion.metric`` is one of the metrics ``evaluate`` writes for ``task`` (None: the task's default)."""
    from .metric_names import is_metric, metric_names

    if metric is not None and not is_metric(str(metric), task):
        raise ConfigError(f"promotion.metric={metric!r} is not a metric of a {task} evaluation: one of "
                          f"{metric_names(task)}")


def check_stages(stages: Any) -> None:
    """Every name of ``stages`` (``cfg.stages``) is a stage of the table; a ConfigError naming it otherwise."""
    unknown = [str(s) for s in stages if str(s) not in stage_names()]
    if unknown:
        raise ConfigError(f"stages={[str(s) for s in stages]}: {unknown} not among the stages {list(stage_names())}")
