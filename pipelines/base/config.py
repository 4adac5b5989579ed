"""Structured configs: the typed schema every YAML file under ``conf/`` is merged into.

The root schema ``ortflow_config`` is stored in Hydra's ConfigStore and listed first in ``conf/config.yaml``'s
defaults, so a value of the wrong type, an unknown key or a choice outside an enum fails at composition with an
error naming the key (``full_key: trainer.max_iter``). The choices of losses, penalties and optimizers are the
names of ortflow's registry (:mod:`ortflow.registry`), so a loss added to the core is a valid ``loss.name``;
:func:`validate` checks them (listing the registry takes seconds of imports, composing does not wait). Rules
that involve several groups (a classifier with a regression loss, Nesterov with the full trainer, ...) are checked
by :func:`validate` once, when a launch starts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

import ortflow
from ortflow.registry import names, select
from ortflow.schedules import SCHEDULES

from .errors import UserError
from .. import stages as stage_table
from ..stages import names as stage_names


#: conf/ at the repository root, as an absolute path: @hydra.main resolves it the same way whether a stage runs
#: as ``python -m pipelines.<stage>`` or is imported (pipelines.mlproject, tests).
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "conf")


class _Choice(str, Enum):
    """An enum whose members print as their value (``${data.name}`` interpolates to ``regression``)."""

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


class Task(_Choice):
    regression = "regression"
    classification = "classification"


class DataKind(_Choice):
    """The data loaders (``data.loader``; by default the one named like ``data.name``)."""

    regression = "regression"
    classification = "classification"
    diabetes = "diabetes"
    breast_cancer = "breast_cancer"
    iris = "iris"
    digits = "digits"
    file = "file"


class ModelKind(_Choice):
    linear = "linear"
    mlp_regressor = "mlp_regressor"
    logistic = "logistic"
    mlp_classifier = "mlp_classifier"


class Activation(_Choice):
    relu = "relu"
    tanh = "tanh"
    logistic = "logistic"
    identity = "identity"


def _registry_choice(name: str, values: list[str]) -> type[_Choice]:
    return _Choice(name, {v: v for v in values})  # type: ignore[return-value]


# loss.name, penalty.name and trainer.optimizer hold names of the core's registry: a loss, penalty or learning
# rate registered in ortflow is a valid choice. They are plain strings in the schema, checked by validate():
# listing the registry imports scikit-learn and onnxruntime (seconds), which composing the config must not wait
# for (a data problem is reported before that).
REGISTRY_KEYS = {"loss.name": "loss", "penalty.name": "penalty", "trainer.optimizer": "learning_rate"}
Schedule = _registry_choice("Schedule", list(SCHEDULES))


class _Classes(Mapping):
    """A mapping of names to classes of ``ortflow``, each imported on first look-up (the entry points compose and
    check the config before the estimators and scikit-learn are imported)."""

    def __init__(self, names: dict[str, str]):
        self._names = names

    def __getitem__(self, key: str) -> type:
        return getattr(ortflow, self._names[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


#: trainer=<name> -> the estimator class; ``torch`` trains the graph as a layer of a torch model
#: (pipelines/stages/train_torch.py)
TRAINERS = _Classes({"full": "OrtGradientOptimizer", "fwbw": "OrtGradientForwardBackwardOptimizer"})
TrainerKind = _registry_choice("TrainerKind", [*TRAINERS, "torch"])


class Direction(_Choice):
    minimize = "minimize"
    maximize = "maximize"


MODEL_TASK = {
    ModelKind.linear: Task.regression,
    ModelKind.mlp_regressor: Task.regression,
    ModelKind.logistic: Task.classification,
    ModelKind.mlp_classifier: Task.classification,
}


@dataclass
class DataConfig:
    """A data set and how it is split. ``name`` is free text naming the data (the runs and, by default, the
    registered model); ``loader`` picks how they are loaded (None: the loader named like ``name``, so
    ``data=diabetes`` needs no loader). The other keys apply where they make sense."""

    name: str = MISSING
    loader: Optional[DataKind] = None
    task: Task = MISSING
    # make_regression / make_classification
    n_samples: int = 1000
    n_features: int = 20
    n_informative: int = 10
    noise: float = 10.0
    class_sep: float = 1.0
    # file: a CSV or Parquet table
    path: Optional[str] = None
    target: Optional[str] = None
    features: Optional[List[str]] = None
    # non-numeric columns and rows with missing/non-finite values: an error (false), or dropped with a warning
    drop_invalid: bool = False
    # the split and the preprocessing (statistics from the training part only)
    test_size: float = 0.2
    validation_fraction: float = 0.2
    standardize: bool = True
    standardize_target: bool = True
    seed: int = "${seed}"  # type: ignore[assignment]


@dataclass
class ModelConfig:
    """The scikit-learn model fitted by ``convert``; its weights are where ONNX training starts."""

    name: ModelKind = MISSING
    task: Task = MISSING
    hidden_layer_sizes: List[int] = field(default_factory=lambda: [32])
    activation: Activation = Activation.relu
    alpha: float = 1e-4
    C: float = 1.0
    fit_intercept: bool = True
    sklearn_max_iter: int = 50
    target_opset: int = 17


@dataclass
class LossConfig:
    name: str = MISSING  # a name of ortflow's registry (family "loss")
    l1_weight: float = 0.5
    l2_weight: float = 0.5


@dataclass
class PenaltyConfig:
    name: str = "none"  # a name of ortflow's registry (family "penalty")
    l1: float = 0.0
    l2: float = 0.0
    # initializers the penalty applies to; None means the weight matrices (coef, coef_<i>), not the intercepts
    weights: Optional[List[str]] = None


@dataclass
class TrainerConfig:
    name: TrainerKind = MISSING  # type: ignore[valid-type]
    # a learning-rate name of ortflow's registry, built with the settings below that its class takes
    optimizer: str = "sgd"  # a name of ortflow's registry (family "learning_rate")
    learning_rate: float = 0.01
    lr_schedule: Schedule = Schedule.constant  # type: ignore[valid-type, attr-defined]
    power_t: float = 0.25
    momentum: float = 0.9
    weight_decay: float = 0.01
    max_iter: int = 20
    batch_size: int = 32
    device: str = "cpu"
    # onnxruntime intra-op threads; None: the trainer picks them from a batch's work (logged as trainer.n_threads_)
    n_threads: Optional[int] = None
    seed: int = "${seed}"  # type: ignore[assignment]
    shuffle: bool = True
    early_stopping: bool = False
    n_iter_no_change: int = 10
    tol: float = 1e-4
    weights_to_train: Optional[List[str]] = None
    # N > 0: a checkpoint every N epochs and after the last, each logged under the run's checkpoint/ at once
    checkpoint_every: int = 0
    # continue a training from a checkpoint folder, or from a logged one: runs:/<train run id>/checkpoint, or
    # just <train run id> (a run killed while RUNNING is then marked KILLED, tagged ortflow.resumed_by)
    resume_from: Optional[str] = None
    # a progress bar over epochs: None (default) when stdout is a terminal, 0 never, 1 or more always
    verbose: Optional[int] = None


@dataclass
class MlflowConfig:
    """Where runs go. Environment variables win: MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME/ID, MLFLOW_RUN_ID."""

    tracking_uri: Optional[str] = None  # None: sqlite:///<root>/mlflow.db
    root: Optional[str] = None  # None: the directory the command was started from
    artifact_root: Optional[str] = None  # None: <root>/mlartifacts (local stores only)
    experiment_name: str = "ortflow"
    run_name: Optional[str] = None
    registered_model_name: str = "ortflow-${data.name}-${model.name}"
    tags: Dict[str, str] = field(default_factory=dict)
    # per-epoch metrics are kept in memory and written asynchronously in batches: every this many seconds ...
    metrics_flush_seconds: float = 10.0
    # ... and every this many epochs (0: time only); always at the end of training
    metrics_flush_every: int = 0
    log_split: bool = True  # log the train/test split as an artifact (stages run alone read it back)
    retries: int = 8  # attempts on "database is locked" and similar transient store errors
    # ... within this many seconds in all (a tracking server restarted within it is survived)
    retry_seconds: float = 60.0
    # a tracking server must answer its /health within this many seconds at start, or nothing runs
    connect_timeout: float = 5.0
    # MLflow's system metrics (CPU, memory, disk, network; GPU with pynvml) on every stage run
    system_metrics: bool = False


@dataclass
class PromotionConfig:
    enabled: bool = True
    metric: Optional[str] = None  # None: test_mse (regression) or test_log_loss (classification)
    direction: Optional[Direction] = None  # None: maximize for r2/accuracy/roc_auc/f1, else minimize
    alias: str = "champion"
    # compare only with a holder evaluated on the same test rows (a fingerprint of the test split)
    require_same_data: bool = True


@dataclass
class SourceConfig:
    """Input of a stage run alone: an earlier stage's run id, or a folder/file holding its outputs."""

    run_id: Optional[str] = None
    path: Optional[str] = None


@dataclass
class Config:
    data: DataConfig = MISSING
    model: ModelConfig = MISSING
    loss: LossConfig = MISSING
    penalty: PenaltyConfig = MISSING
    trainer: TrainerConfig = MISSING
    mlflow: MlflowConfig = MISSING
    promotion: PromotionConfig = MISSING
    source: SourceConfig = field(default_factory=SourceConfig)
    # the stages pipelines.main runs, in order: by default every stage of the table (pipelines/stages/__init__.py)
    stages: List[str] = field(default_factory=lambda: list(stage_names()))
    seed: int = 42
    # The value a stage (and pipelines.main) returns to Hydra: what an Optuna sweep optimizes.
    optimized_metric: str = "validation_loss"
    # true: an expected error (config, data, tracking store) shows its traceback instead of one line and a hint
    debug: bool = False


class ConfigError(UserError, ValueError):
    """A combination of values that cannot work; the message names the keys."""


#: what ``data.name`` may hold: it names runs and the registered model (MLflow refuses '/' and ':')
DATA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def file_stem(path: str) -> str:
    """``data.name`` of a table by default: its file name without suffix, reduced to the characters of
    :data:`DATA_NAME` (the ``ortflow.stem`` resolver of conf/data/file.yaml)."""
    stem = "".join(c if c.isalnum() or c in "_.-" else "_" for c in Path(str(path)).stem).lstrip("._-")
    return stem[:100] or "table"


def data_loader(data: DictConfig) -> str:
    """The loader of ``data``: ``data.loader``, else the one named like ``data.name``; a ConfigError otherwise."""
    loader = _value(data.loader) if data.loader is not None else str(data.name)
    if loader not in {k.value for k in DataKind}:
        raise ConfigError(f"data.name={data.name!r} is not a built-in data set ({[k.value for k in DataKind]}) and "
                          "data.loader is not set: for your own table use data=file data.path=<file> "
                          "data.target=<column> (data.name=<name> names it)")
    return loader


def register_configs() -> None:
    """Store the schema under the name ``conf/config.yaml`` lists first in its defaults; register the resolvers
    the YAML files use."""
    ConfigStore.instance().store(name="ortflow_config", node=Config)
    if not OmegaConf.has_resolver("ortflow.stem"):
        OmegaConf.register_new_resolver("ortflow.stem", file_stem)
    if not OmegaConf.has_resolver("ortflow.stages"):  # the --help text (conf/hydra/help/ortflow.yaml)
        OmegaConf.register_new_resolver("ortflow.stages", stage_listing)


def validate(cfg: DictConfig) -> None:
    """Cross-group checks that a per-key type cannot express, and the registry names (:data:`REGISTRY_KEYS`)."""
    validate_data(cfg.data)
    for key, kind in REGISTRY_KEYS.items():
        value = OmegaConf.select(cfg, key)
        if value not in names(kind):
            raise ConfigError(f"{key}={value!r} is not one of {names(kind)} (the names of ortflow's registry)")
    data_task = Task(_value(cfg.data.task))
    model = ModelKind(_value(cfg.model.name))
    chosen_loss = loss(cfg)
    if MODEL_TASK[model] != data_task:
        raise ConfigError(
            f"model={model.value} is a {MODEL_TASK[model].value} model but data={_value(cfg.data.name)} is a "
            f"{data_task.value} data set (data.task); pick a matching model (e.g. "
            f"{'mlp_classifier' if data_task == Task.classification else 'mlp_regressor'})"
        )
    if _value(cfg.model.task) != data_task.value:
        raise ConfigError(f"model.task={_value(cfg.model.task)} does not match data.task={data_task.value}")
    if chosen_loss.task != data_task.value:
        fitting = [n for n in names("loss") if select("loss", n).task == data_task.value]
        raise ConfigError(f"loss={_value(cfg.loss.name)} does not fit data.task={data_task.value}: use "
                          + " or ".join(f"loss={n}" for n in fitting))
    if _value(cfg.trainer.name) == "full":
        try:
            learning_rate(cfg).step_options()
        except ValueError as exc:
            raise ConfigError(f"trainer.optimizer={_value(cfg.trainer.optimizer)} needs trainer=fwbw: {exc}") from exc
    for key in ("data.test_size", "data.validation_fraction"):
        value = OmegaConf.select(cfg, key)
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{key}={value} must be in [0, 1)")
    if not 0.0 < cfg.data.test_size:
        raise ConfigError("data.test_size must be > 0: evaluate needs a test split")
    if cfg.mlflow.metrics_flush_every < 0 or cfg.mlflow.metrics_flush_seconds <= 0:
        raise ConfigError("mlflow.metrics_flush_every must be >= 0 and mlflow.metrics_flush_seconds > 0")
    if cfg.mlflow.retry_seconds <= 0 or cfg.mlflow.connect_timeout <= 0:
        raise ConfigError("mlflow.retry_seconds and mlflow.connect_timeout must be > 0")
    for key in ("trainer.max_iter", "trainer.batch_size", "mlflow.retries"):
        if OmegaConf.select(cfg, key) < 1:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)} must be >= 1")
    if cfg.data.n_samples < 10 or cfg.data.n_features < 1:
        raise ConfigError(f"data.n_samples={cfg.data.n_samples} must be >= 10 and data.n_features >= 1")
    if cfg.trainer.learning_rate <= 0:
        raise ConfigError(f"trainer.learning_rate={cfg.trainer.learning_rate} must be > 0")
    if str(cfg.penalty.name) == "elastic" and cfg.penalty.l1 <= 0 and cfg.penalty.l2 <= 0:
        raise ConfigError("penalty=elastic needs penalty.l1 > 0 or penalty.l2 > 0")
    check_stages(cfg.stages)


def check_stages(stages: Any) -> None:
    """Every name of ``stages`` (``cfg.stages``) is a stage of the table; a ConfigError naming it otherwise."""
    unknown = [str(s) for s in stages if str(s) not in stage_names()]
    if unknown:
        raise ConfigError(f"stages={[str(s) for s in stages]}: {unknown} not among the stages {list(stage_names())}")


def stage_listing() -> str:
    """The stages for ``--help`` (the ``ortflow.stages`` resolver): their order, then one line each."""
    return " -> ".join(stage_names()) + "".join(f"\n    {s.name:<10} {s.summary}" for s in stage_table.TABLE)


def validate_data(data: DictConfig) -> None:
    """The checks of the ``data`` group alone: a loader, a path and a target for a table, a usable name."""
    loader = data_loader(data)
    if loader == DataKind.file.value and any(OmegaConf.is_missing(data, k) or not data[k] for k in ("path", "target")):
        raise ConfigError("data=file needs data.path (a .csv or .parquet file) and data.target (the label column)")
    if not DATA_NAME.match(str(data.name)):
        raise ConfigError(f"data.name={data.name!r} names the runs and the registered model: use letters, "
                          "digits, '_', '.' and '-' (at most 100, starting with a letter or digit)")


def learning_rate(cfg: DictConfig) -> ortflow.BaseLearningRate:
    """``trainer.optimizer`` from the registry, built with the ``trainer`` settings its class takes
    (``learning_rate`` is its ``eta0``, ``lr_schedule`` its schedule)."""
    t = cfg.trainer
    return select("learning_rate", _value(t.optimizer), "trainer.optimizer", eta0=float(t.learning_rate),
                  learning_rate=_value(t.lr_schedule), power_t=float(t.power_t), momentum=float(t.momentum),
                  weight_decay=float(t.weight_decay))


def loss(cfg: DictConfig) -> ortflow.BaseLearningLoss:
    """``loss.name`` from the registry, with the ``loss`` settings its class takes."""
    return select("loss", _value(cfg.loss.name), "loss", l1_weight=float(cfg.loss.l1_weight),
                  l2_weight=float(cfg.loss.l2_weight))


def trainer_verbose(cfg: DictConfig) -> int:
    """``trainer.verbose``, or when it is None 1 (ortflow's progress bar over epochs) if stdout is a terminal and
    0 otherwise: a bar for a person at a terminal, clean logs for jobs, CI and pipes."""
    import sys

    verbose = cfg.trainer.verbose
    return int(verbose) if verbose is not None else int(sys.stdout.isatty())


def penalty_weights(cfg: DictConfig, names_in_graph: list[str]) -> list[str]:
    """The weights ``penalty`` applies to: ``penalty.weights``, or the graph's weight matrices (``coef`` of a
    linear model, ``coef_<i>`` of an MLP; not the intercepts)."""
    if cfg.penalty.weights:
        return list(cfg.penalty.weights)
    return [n for n in names_in_graph if n == "coef" or n.startswith("coef_")]


def _value(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def to_container(cfg: DictConfig) -> dict:
    """The resolved config as plain Python values (enums as strings)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def task_of(cfg: DictConfig) -> str:
    return _value(cfg.data.task)
