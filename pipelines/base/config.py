"""Structured configs: the typed schema every YAML file under ``conf/`` is merged into.

The root schema ``ortflow_config`` is stored in Hydra's ConfigStore and listed first in ``conf/config.yaml``'s
defaults, so a value of the wrong type, an unknown key or a choice outside an enum fails at composition with an
error naming the key (``full_key: trainer.max_iter``). The choices of losses, penalties and optimizers are the
names of ortflow's registry (:mod:`ortflow.registry`), so a loss added to the core is a valid ``loss.name``.
Everything else is checked once by :func:`validate`, when a launch starts and before any stage or MLflow run:
keys added past the schema (``+trainer.foo=1``), the registry names (listing the registry takes seconds of
imports, composing does not wait), each setting against the part it belongs to (an optimizer setting its class
does not take, the trainer's settings against the trainer's table of parameters in :mod:`ortflow.parameters`),
rules that involve several groups (a classifier with a regression loss, ...) and
``promotion.metric`` against the task's metrics. The train stage builds the trainer from the same
:func:`trainer_arguments`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

import ortflow
from ortflow.registry import names, select
from ortflow.schedules import SCHEDULES

from .errors import CLOSE_KEYS, UserError
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
    parquet = "parquet"  # a Parquet file or folder streamed (pipelines/data/streams.py), never read whole
    # arrays for model=onnx graphs: digits as (n, 1, 8, 8) float32 images in [0, 1], synthetic int64 token sequences
    digits_images = "digits_images"
    tokens = "tokens"


#: the loaders whose rows are not feature vectors (images, int64 tokens): never standardized, for model=onnx graphs
ARRAY_LOADERS = ("digits_images", "tokens")


class ModelKind(_Choice):
    linear = "linear"
    mlp_regressor = "mlp_regressor"
    logistic = "logistic"
    mlp_classifier = "mlp_classifier"
    ridge = "ridge"
    lasso = "lasso"
    elastic_net = "elastic_net"
    sgd_regressor = "sgd_regressor"
    huber = "huber"
    quantile = "quantile"
    sgd_classifier = "sgd_classifier"
    linear_svc = "linear_svc"
    poisson = "poisson"
    onnx = "onnx"  # your own ONNX graph (model.path): no scikit-learn model, the task is the data's


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
REGISTRY_KEYS = {"loss.name": "loss", "penalty.name": "penalty", "trainer.optimizer": "optimizer"}
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
TRAINERS = _Classes({"full": "OrtGradientOptimizer", "fwbw": "OrtGradientForwardBackwardOptimizer",
                     "torch": "TorchTrainer"})
TrainerKind = _registry_choice("TrainerKind", list(TRAINERS))


class Direction(_Choice):
    minimize = "minimize"
    maximize = "maximize"


class RegisterPolicy(_Choice):
    """Which exported models become registry versions (``promotion.register``)."""

    always = "always"  # every chain's model, and a sweep's best trial
    if_promoted = "if_promoted"  # only a model that takes the alias (chains and a sweep's best trial alike)
    best_of_sweep = "best_of_sweep"  # only a sweep's best trial (through the gate); single chains register nothing


MODEL_TASK = {
    ModelKind.linear: Task.regression,
    ModelKind.mlp_regressor: Task.regression,
    ModelKind.logistic: Task.classification,
    ModelKind.mlp_classifier: Task.classification,
    ModelKind.ridge: Task.regression,
    ModelKind.lasso: Task.regression,
    ModelKind.elastic_net: Task.regression,
    ModelKind.sgd_regressor: Task.regression,
    ModelKind.huber: Task.regression,
    ModelKind.quantile: Task.regression,
    ModelKind.sgd_classifier: Task.classification,
    ModelKind.linear_svc: Task.classification,
    ModelKind.poisson: Task.regression,
}  # model=onnx: either task (the data's)


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
    vocab_size: int = 32  # tokens: the token ids are below it (the sequence length is n_features)
    noise: float = 10.0
    class_sep: float = 1.0
    # file: a CSV or Parquet table
    path: Optional[str] = None
    target: Optional[str] = None
    features: Optional[List[str]] = None
    # non-numeric columns and rows with missing/non-finite values: an error (false), or dropped with a warning
    drop_invalid: bool = False
    # parquet: the column whose stable hash splits the rows (None: whole files by the hash of their names), the
    # rows of each part read to set things up (start model, standardization), the rows held at once when streaming
    key: Optional[str] = None
    sample_rows: int = 10000
    buffer_rows: int = 65536
    # the split and the preprocessing (statistics from the training part only)
    test_size: float = 0.2
    validation_fraction: float = 0.2
    standardize: bool = True
    standardize_target: bool = True
    seed: int = "${seed}"  # type: ignore[assignment]


class PreprocessKind(_Choice):
    """``preprocess=``: how a table's columns become features (``data=file`` only; bundled sets are numbers)."""

    auto = "auto"  # numbers imputed and scaled, text one-hot, booleans imputed, dates split into parts
    none = "none"  # numeric columns only, standardized; text and gaps refused (or dropped: data.drop_invalid)


#: what ``preprocess.columns.<column>`` may say about a column (see pipelines/modeling/estimators.py)
COLUMN_TREATMENTS = ("drop", "scale", "passthrough", "onehot", "ordinal", "date")


@dataclass
class PreprocessConfig:
    """The preprocessing ``convert`` fits in front of the model on a table (``preprocess=auto``); it becomes the
    first part of the ONNX graph, frozen while the model's weights train, so the registered model takes the raw
    columns. ``columns``: a treatment per column overriding the one its type gets (:data:`COLUMN_TREATMENTS`)."""

    name: PreprocessKind = PreprocessKind.auto
    columns: Dict[str, str] = field(default_factory=dict)


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
    # the iterations of the *start*, the under-trained scikit-learn fit ONNX training begins from; the scikit-learn
    # reference that evaluate compares with (sklearn_test_*) is fitted to convergence with the class's defaults
    start_max_iter: int = 50
    target_opset: int = 17
    l1_ratio: float = 0.5  # elastic_net
    epsilon: float = 1.35  # huber
    quantile: float = 0.5  # quantile
    # sgd_regressor / sgd_classifier: scikit-learn's loss (None: squared_error / log_loss)
    sgd_loss: Optional[str] = None
    # model=onnx: the .onnx file to train (relative to the directory the command starts from) and the output to
    # train (the logits of a classifier, the prediction of a regressor; None: the graph's only output)
    path: Optional[str] = None
    output: Optional[str] = None


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


class Gradients(_Choice):
    """Who builds the gradient graphs (trainer=full and fwbw; see ortflow.parameters.GRADIENTS)."""

    auto = "auto"
    ortflow = "ortflow"
    onnxruntime = "onnxruntime"


@dataclass
class TrainerConfig:
    """The trainer's settings. A setting left None is not passed: the part it belongs to keeps its own default.
    A setting given a value that the chosen trainer or optimizer does not take is refused by :func:`validate`."""

    name: TrainerKind = MISSING  # type: ignore[valid-type]
    # a learning-rate name of ortflow's registry, built with the settings below that its class takes
    optimizer: str = "sgd"  # a name of ortflow's registry (family "optimizer")
    learning_rate: float = 0.01  # the optimizer's eta0
    # sgd and nesterov only; None: constant
    lr_schedule: Optional[Schedule] = None  # type: ignore[valid-type]
    power_t: Optional[float] = None  # sgd and nesterov (invscaling); None: 0.25
    momentum: Optional[float] = None  # nesterov; None: 0.9
    weight_decay: Optional[float] = None  # adamw; None: 0.01
    # full and fwbw: 'auto' (ortflow's graphs, onnxruntime's on the training build for an op outside ortflow's
    # gradient rules), 'ortflow' or 'onnxruntime' (training build only); None: auto
    gradients: Optional[Gradients] = None
    max_iter: int = 20
    batch_size: int = 32
    device: str = "cpu"  # trainer=torch: cpu only
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
    # data=parquet: also a checkpoint inside an epoch, at the first chunk boundary after every N rows trained (a run
    # killed mid-epoch resumes there); needs checkpoint_every > 0
    checkpoint_every_rows: Optional[int] = None
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
    # MLflow's system metrics (CPU, memory, disk, network; GPU with pynvml) on every stage run ...
    system_metrics: bool = False
    # ... sampled every this many seconds (MLflow's default, 10 s, outlasts most stages; a stage shorter than one
    # interval records none); MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL in the environment wins
    system_metrics_interval: float = 1.0


@dataclass
class PromotionConfig:
    enabled: bool = True
    metric: Optional[str] = None  # None: test_mse (regression) or test_log_loss (classification)
    direction: Optional[Direction] = None  # None: maximize for r2/accuracy/roc_auc/f1, else minimize
    alias: str = "champion"
    # compare only with a holder evaluated on the same test rows (a fingerprint of the test split)
    require_same_data: bool = True
    # which models become registry versions: if_promoted keeps the registry to the versions that took the alias
    register: RegisterPolicy = RegisterPolicy.if_promoted


@dataclass
class SourceConfig:
    """Input of a stage run alone: an earlier stage's run id, or a folder/file holding its outputs."""

    run_id: Optional[str] = None
    path: Optional[str] = None


@dataclass
class Config:
    data: DataConfig = MISSING
    # model= and loss= left unchosen (conf/config.yaml): their options follow data.task (see follow_task)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    penalty: PenaltyConfig = MISSING
    trainer: TrainerConfig = MISSING
    mlflow: MlflowConfig = MISSING
    promotion: PromotionConfig = MISSING
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    source: SourceConfig = field(default_factory=SourceConfig)
    # the stages pipelines.main runs, in order: by default every stage of the table (pipelines/stages/__init__.py)
    stages: List[str] = field(default_factory=lambda: list(stage_names()))
    seed: int = 42
    # The value a stage (and pipelines.main) returns to Hydra: what an Optuna sweep optimizes.
    optimized_metric: str = "validation_loss"
    # true: an expected error (config, data, tracking store) shows its traceback instead of one line and a hint
    debug: bool = False


class ConfigError(UserError, ValueError):
    """A combination of values that cannot work; the message names the keys. ``problems`` holds every problem
    found in one check of the config (:func:`validate` reports them all at once, not the first only)."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems) if problems else [message]

    @classmethod
    def of(cls, problems: list[str]) -> "ConfigError":
        if len(problems) == 1:
            return cls(problems[0])
        return cls(f"{len(problems)} problems in the config: " + "; ".join(
            f"({i}) {p}" for i, p in enumerate(problems, 1)), problems)


#: the options model= and loss= take for each data.task when neither the command line nor an experiment picks one
TASK_DEFAULTS = {"regression": {"model": "linear", "loss": "square"},
                 "classification": {"model": "logistic", "loss": "log"}}
_GROUP_SCHEMA = {"model": ModelConfig, "loss": LossConfig}


def follow_task(cfg: DictConfig) -> dict[str, str]:
    """Give ``model`` and ``loss`` their option of :data:`TASK_DEFAULTS` for ``data.task`` when none was chosen
    (their ``name`` is missing): the option's file under ``conf/``, with the keys the command line or an experiment
    set (those that differ from the schema's defaults) on top. An explicit choice is kept as it is, a
    contradictory one is refused by :func:`validate` naming both. Returns the options it picked."""
    picked: dict[str, str] = {}
    if OmegaConf.is_missing(cfg.data, "task"):
        return picked
    for group, option in TASK_DEFAULTS[_value(cfg.data.task)].items():
        node = cfg[group]
        if not OmegaConf.is_missing(node, "name"):
            continue
        defaults = OmegaConf.to_container(OmegaConf.structured(_GROUP_SCHEMA[group]), resolve=False)
        current = OmegaConf.to_container(node, resolve=False, enum_to_str=True)
        given = {k: v for k, v in current.items() if v != "???" and v != _plain(defaults.get(k))}
        cfg[group] = OmegaConf.merge(OmegaConf.structured(_GROUP_SCHEMA[group]),
                                     OmegaConf.load(Path(CONFIG_DIR) / group / f"{option}.yaml"), given)
        picked[group] = option
    return picked


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def choice_hint(group: str, names_fitting: list[str]) -> str:
    """How to pick each of ``names_fitting``: ``group=<option>`` where ``conf/<group>/<option>.yaml`` exists,
    else ``<group>.name=<name>`` (a registry name with no file of its own is not a valid ``group=`` choice)."""
    options = {p.stem for p in (Path(CONFIG_DIR) / group).glob("*.yaml")}
    files = [f"{group}={n}" for n in names_fitting if n in options]
    others = [n for n in names_fitting if n not in options]
    return " or ".join(files + ([f"{group}.name=<one of {others}>"] if others else []))


#: names other libraries give a key, and the schema's name for it (difflib offered trainer.tol for trainer.lr)
KEY_ALIASES = {"lr": "learning_rate", "learning_rate_init": "learning_rate", "eta0": "learning_rate",
               "epochs": "max_iter", "n_epochs": "max_iter", "n_iter": "max_iter"}


def close_keys(key: str, candidates: list[str], n: int = 3) -> list[str]:
    """The names of ``candidates`` closest to ``key`` (:data:`KEY_ALIASES`, else difflib), for a 'did you mean'
    hint; every one exists. Dotted keys share their group's prefix, which alone makes them look alike: they must
    be closer."""
    import difflib

    group, _, leaf = key.rpartition(".")
    alias = ".".join(filter(None, (group, KEY_ALIASES.get(leaf, ""))))
    if leaf in KEY_ALIASES and alias in candidates:
        return [alias]
    return difflib.get_close_matches(key, candidates, n=n, cutoff=0.8 if "." in key else 0.6)


def schema_keys(schema: type = None, prefix: str = "") -> list[str]:  # type: ignore[assignment]
    """Every key of the config schema, dotted (``trainer.max_iter``), groups first: what ``key=value`` may set."""
    schema = schema or Config
    keys = []
    for f, t in get_type_hints(schema).items():
        if is_dataclass(t):
            keys.extend(schema_keys(t, f"{prefix}{f}."))
        else:
            keys.append(f"{prefix}{f}")
    return keys


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
    CLOSE_KEYS["find"] = lambda key: close_keys(key, schema_keys())  # the 'did you mean' of a refused key
    if not OmegaConf.has_resolver("ortflow.stem"):
        OmegaConf.register_new_resolver("ortflow.stem", file_stem)
    if not OmegaConf.has_resolver("ortflow.stages"):  # the --help text (conf/hydra/help/ortflow.yaml)
        OmegaConf.register_new_resolver("ortflow.stages", stage_listing)
    if not OmegaConf.has_resolver("ortflow.app_keys"):
        OmegaConf.register_new_resolver("ortflow.app_keys", app_keys)


def validate(cfg: DictConfig) -> None:
    """Every check of the settings, once, before any stage runs: keys outside the schema, cross-group rules that
    a per-key type cannot express, the registry names (:data:`REGISTRY_KEYS`), the trainer's settings against its
    table of parameters (:func:`check_trainer`) and ``promotion.metric`` against the task's metrics. ``model`` and
    ``loss`` left unchosen first get the options of ``data.task`` (:func:`follow_task`). Every problem found is
    reported in one :class:`ConfigError` (its ``problems``), not the first only."""
    follow_task(cfg)
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
    check(check_promotion_metric, cfg.promotion.metric, _value(cfg.data.task))
    trainer_ok = check(check_trainer, cfg, False)  # first the checks that need no registry (seconds of imports)
    registry_ok = {kind: check(_check_registry_name, cfg, key, kind) for key, kind in REGISTRY_KEYS.items()}
    check(check_task, cfg, registry_ok["loss"])
    if trainer_ok and all(registry_ok.values()):
        check(check_trainer, cfg)
    check(_check_values, cfg)
    check(check_stages, cfg.stages)
    check(check_preprocess, cfg.preprocess)
    if problems:
        raise ConfigError.of(problems)


def _check_registry_name(cfg: DictConfig, key: str, kind: str) -> None:
    value = OmegaConf.select(cfg, key)
    if value not in names(kind):
        close = close_keys(str(value), names(kind))
        raise ConfigError(f"{key}={value!r} is not one of {names(kind)} (the names of ortflow's registry)"
                          + (f"; did you mean {' or '.join(f'{key}={c}' for c in close)}?" if close else ""))


def check_task(cfg: DictConfig, loss_known: bool = True) -> None:
    """``model`` and ``loss`` against ``data.task``: a contradictory choice is a ConfigError naming both sides
    (``loss_known``: ``loss.name`` is a registry name, else its task is not checked)."""
    data_task = Task(_value(cfg.data.task))
    data = f"data={_value(cfg.data.name)}" + (f" (data.task={data_task.value})"
                                                if _value(cfg.data.name) != data_task.value else "")
    problems = []
    model = ModelKind(_value(cfg.model.name))
    if model == ModelKind.onnx:  # the user's graph takes the data's task; its outputs are checked against the data
        if _value(cfg.model.task) != data_task.value:
            problems.append(f"model.task={_value(cfg.model.task)} does not match data.task={data_task.value} "
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
                        f"(it follows data.task: model={TASK_DEFAULTS[data_task.value]['model']})")
    elif _value(cfg.model.task) != data_task.value:
        problems.append(f"model.task={_value(cfg.model.task)} does not match data.task={data_task.value}")
    if model == ModelKind.poisson and cfg.data.standardize_target:
        problems.append("model=poisson predicts exp(score), a count or rate: its target must keep its units "
                        "(data.standardize_target=false), and train with loss.name=poisson")
    if loss_known:
        chosen_loss = loss(cfg)
        if chosen_loss.task != data_task.value:
            fitting = sorted({select("loss", n).names[0] for n in names("loss")
                              if select("loss", n).task == data_task.value})
            problems.append(f"loss={_value(cfg.loss.name)} is a {chosen_loss.task} loss but {data} is a "
                            f"{data_task.value} data set: use {choice_hint('loss', fitting)}, or leave loss= out "
                            f"(it follows data.task: loss={TASK_DEFAULTS[data_task.value]['loss']})")
    if problems:
        raise ConfigError.of(problems)


def _check_values(cfg: DictConfig) -> None:
    """The numeric ranges of ``data``, ``mlflow`` and ``penalty``."""
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
        if _value(cfg.data.loader) != DataKind.parquet.value or cfg.trainer.checkpoint_every < 1:
            problems.append(f"trainer.checkpoint_every_rows={every_rows}: checkpoints inside an epoch are for a "
                            "streamed table (data=parquet) with trainer.checkpoint_every >= 1; an in-memory "
                            "epoch checkpoints at its end")
    if str(cfg.penalty.name) == "elastic" and cfg.penalty.l1 <= 0 and cfg.penalty.l2 <= 0:
        problems.append("penalty=elastic needs penalty.l1 > 0 or penalty.l2 > 0")
    if problems:
        raise ConfigError.of(problems)


def check_preprocess(preprocess: DictConfig) -> None:
    """Each ``preprocess.columns.<column>`` names a treatment of :data:`COLUMN_TREATMENTS`."""
    bad = {str(k): str(v) for k, v in (preprocess.get("columns") or {}).items() if str(v) not in COLUMN_TREATMENTS}
    if bad:
        raise ConfigError(f"preprocess.columns {bad}: each column's treatment is one of {list(COLUMN_TREATMENTS)}")


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


#: the app whose ``--help`` is shown: ``main`` or a stage (set by :func:`pipelines.cli.app`)
HELP_APP = {"name": "main"}
#: what every stage reads besides its own keys
COMMON_KEYS = ("source", "mlflow", "seed", "debug")


def app_keys() -> str:
    """The keys the app of ``--help`` reads (the ``ortflow.app_keys`` resolver): a stage's own (its ``reads`` in
    the stage table), the chain's every group; each group with its keys."""
    name = HELP_APP["name"]
    if name in stage_names():
        own, title = stage_table.stage(name).reads, f"Keys of stage {name} (python -m pipelines.{name})"
    else:
        own, title = ("data", "model", "loss", "penalty", "trainer", "promotion", "stages", "optimized_metric"), \
            "Keys of the chain (python -m pipelines.main)"
    keys = schema_keys()
    lines = [f"{title}; set any with key=value (--cfg job prints their values):"]
    for entry in (*own, *COMMON_KEYS):
        inside = [k[len(entry) + 1:] for k in keys if k.startswith(f"{entry}.")]
        lines.append(f"    {entry}: {', '.join(inside)}" if inside else f"    {entry}")
    return "\n".join(lines)


def stage_listing() -> str:
    """The stages for ``--help`` (the ``ortflow.stages`` resolver): their order, then one line each."""
    return " -> ".join(stage_names()) + "".join(f"\n    {s.name:<10} {s.summary}" for s in stage_table.TABLE)


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


#: trainer.<key> -> the learning-rate parameter it sets: the first of these names its class takes
OPTIMIZER_KEYS = {"learning_rate": ("eta0",), "lr_schedule": ("schedule", "learning_rate"), "power_t": ("power_t",),
                  "momentum": ("momentum",), "weight_decay": ("weight_decay",)}
#: what a None of OPTIMIZER_KEYS means for a class that takes the setting (else: the class's own default)
OPTIMIZER_DEFAULTS = {"lr_schedule": "constant"}
#: trainer.<key> -> the trainer parameter it sets; a key whose parameter the chosen trainer has not (gradients with
#: trainer=torch) is refused when set
TRAINER_KEYS = {"max_iter": "max_iter", "batch_size": "batch_size", "device": "device", "n_threads": "n_threads",
                "seed": "random_state", "shuffle": "shuffle", "early_stopping": "early_stopping",
                "n_iter_no_change": "n_iter_no_change", "tol": "tol", "weights_to_train": "weights_to_train",
                "gradients": "gradients"}


def learning_rate(cfg: DictConfig) -> ortflow.BaseLearningRate:
    """``trainer.optimizer`` from the registry, built with the ``trainer`` settings (:data:`OPTIMIZER_KEYS`) that
    were set and that its class takes; a set one that it does not take is a :class:`ConfigError` naming it."""
    from ortflow.registry import family, settings_of

    t, name = cfg.trainer, _value(cfg.trainer.optimizer)
    if name not in names("optimizer"):
        raise ConfigError(f"trainer.optimizer={name!r} is not one of {names('optimizer')} (the names of "
                          "ortflow's registry)")
    taken = settings_of(family("optimizer")[name])
    settings = {}
    for key, candidates in OPTIMIZER_KEYS.items():
        value = _value(t[key]) if t[key] is not None else None
        param = next((c for c in candidates if c in taken), None)
        if value is None:
            value = OPTIMIZER_DEFAULTS.get(key) if param is not None else None
            if value is None:
                continue
        if param is None:
            raise ConfigError(f"trainer.{key}={value}: trainer.optimizer={name} takes no {key} (its settings: "
                              f"{[k for k, c in OPTIMIZER_KEYS.items() if any(x in taken for x in c)]})")
        settings[param] = value
    rate = select("optimizer", name, "trainer.optimizer", **settings)
    try:
        rate.check()
    except ValueError as exc:  # the message names the class's parameter: name the trainer key instead
        keys = {param: key for key, candidates in OPTIMIZER_KEYS.items() for param in candidates if param in settings}
        message = re.sub(r"\b(\w+)=", lambda m: f"trainer.{keys[m[1]]}=" if m[1] in keys else m[0], str(exc))
        raise ConfigError(f"trainer.optimizer={name}: {message}") from None
    return rate


def loss(cfg: DictConfig) -> ortflow.BaseLearningLoss:
    """``loss.name`` from the registry, with the ``loss`` settings its class takes (the group's defaults hold
    l1_weight and l2_weight, the elastic loss's)."""
    from ortflow.registry import family, settings_of

    name = _value(cfg.loss.name)
    taken = settings_of(family("loss").get(name, object))
    return select("loss", name, "loss", **{k: float(cfg.loss[k]) for k in ("l1_weight", "l2_weight") if k in taken})


def _trainer_table(cfg: DictConfig) -> tuple:
    from ortflow.parameters import TRAINERS as TABLES

    return TABLES[TRAINERS._names[_value(cfg.trainer.name)]]


def trainer_settings(cfg: DictConfig) -> dict[str, Any]:
    """The trainer's parameters set by :data:`TRAINER_KEYS` (no registry needed); a set key the chosen trainer
    does not take is a ConfigError."""
    t, name = cfg.trainer, _value(cfg.trainer.name)
    taken = {p.name for p in _trainer_table(cfg)}
    args: dict[str, Any] = {}
    for key, param in TRAINER_KEYS.items():
        value = t[key]
        if param not in taken:
            if value is not None:
                raise ConfigError(f"trainer.{key}={_value(value)}: trainer={name} takes no {key}")
            continue
        if value is None and param == "gradients":
            continue
        args[param] = list(value) if key == "weights_to_train" and value else _value(value)
    return args


def trainer_arguments(cfg: DictConfig, callbacks: list | None = None) -> dict[str, Any]:
    """The estimator's parameters from ``trainer`` (and ``loss`` for the trainers that add the loss themselves),
    except the graph and the penalty (it needs the graph's weights)."""
    args = trainer_settings(cfg)
    args.update(learning_rate=learning_rate(cfg), verbose=trainer_verbose(cfg), callbacks=callbacks or [], exc=True)
    if any(p.name == "learning_loss" for p in _trainer_table(cfg)):
        args["learning_loss"] = loss(cfg)
    else:
        args["loss_output_name"] = "loss"
    return args


def check_trainer(cfg: DictConfig, registry: bool = True) -> None:
    """The trainer's settings checked once, against the trainer's own table of parameters
    (:data:`ortflow.parameters.TRAINERS`): a ConfigError naming the ``trainer`` key. ``registry=False`` checks
    those that need no registry look-up (they fail in a fraction of a second, scikit-learn not imported)."""
    args = trainer_arguments(cfg) if registry else trainer_settings(cfg)
    keys = {param: key for key, param in TRAINER_KEYS.items()}
    for param in _trainer_table(cfg):
        if param.name not in args or param.check is None:
            continue
        key = f"trainer.{keys.get(param.name, param.name)}"
        try:
            param.check(key, args[param.name])
        except (ValueError, TypeError, ImportError) as exc:
            message = str(exc).splitlines()[0]
            raise ConfigError(message if key in message else f"{key}={args[param.name]}: {message}") from None


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
