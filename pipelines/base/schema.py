"""Structured configs: the typed schema every YAML file under ``conf/`` is merged into.

The root schema ``ortflow_config`` is stored in Hydra's ConfigStore (:func:`pipelines.base.resolvers.register_configs`)
and listed first in ``conf/config.yaml``'s defaults, so a value of the wrong type, an unknown key or a choice outside
an enum fails at composition with an error naming the key (``full_key: trainer.max_iter``). The choices of
``model.name`` come from the table of models (:mod:`pipelines.base.models`). The ``loss`` and ``penalty`` groups
hold a registry name (:mod:`ortflow.registry`) and the settings of its class, which the schema cannot know: they are
checked by :mod:`pipelines.base.checks`, as is everything a per-key type cannot express. The ``trainer`` group
(:data:`TrainerConfig`) is generated from the core's tables of trainer parameters (:mod:`ortflow.trainers.parameters`) and the
optimizers' constructors, with the pipelines' own defaults on top (:data:`TRAINER_DEFAULTS`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, is_dataclass, make_dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Dict, List, Optional, Union, get_type_hints

from omegaconf import MISSING, DictConfig, OmegaConf

import ortflow
from ortflow.optimizers.schedules import SCHEDULES

from .errors import UserError
from . import models
from .stages import names as stage_names


#: conf/ at the repository root, as an absolute path: @hydra.main resolves it the same way whether a stage runs
#: as ``python -m pipelines.<stage>`` or is imported (pipelines.mlproject, tests).
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "conf")


class _Choice(str, Enum):
    """An enum whose members print as their value (``${data.name}`` interpolates to ``regression``)."""

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


class JunkCells(_Choice):
    """``data.junk_cells``: what becomes of the cells of a numeric column that are not numbers (``?``, ``n.a.``)."""

    refuse = "refuse"  # a DataError naming the column, the count and the first cells
    gap = "gap"  # gaps, which the preprocessing imputes, with a warning naming them


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


def _choices(name: str, values: list[str]) -> type[_Choice]:
    return _Choice(name, {v: v for v in values})  # type: ignore[return-value]


#: ``model.name``: the models of the table (:data:`pipelines.base.models.MODELS`)
ModelKind = _choices("ModelKind", [m.name for m in models.MODELS])


class Activation(_Choice):
    relu = "relu"
    tanh = "tanh"
    logistic = "logistic"
    identity = "identity"


Schedule = _choices("Schedule", list(SCHEDULES))


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


TrainerKind = _choices("TrainerKind", list(TRAINERS))


class Direction(_Choice):
    minimize = "minimize"
    maximize = "maximize"


class RegisterPolicy(_Choice):
    """Which exported models become registry versions (``promotion.register``)."""

    always = "always"  # every chain's model, and a sweep's best trial
    if_promoted = "if_promoted"  # only a model that takes the alias (chains and a sweep's best trial alike)
    best_of_sweep = "best_of_sweep"  # only a sweep's best trial (through the gate); single chains register nothing


#: model -> its task (model=onnx: either task, the data's)
MODEL_TASK = {ModelKind(name): Task(task) for name, task in models.MODEL_TASK.items()}


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
    # preprocess=auto: the cells of a numeric column that are not numbers ('?' among numbers): refused, or gaps
    junk_cells: JunkCells = JunkCells.refuse
    # parquet: the column whose stable hash splits the rows (None: the hash of each row's position), the
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
    # the estimator's settings that its own loss takes (loss.name unset: ortflow.objectives.estimator_loss reads them from the
    # fitted estimator); None leaves the estimator's default. A loss named with loss.name takes loss.<setting> only
    epsilon: Optional[float] = None  # huber (conf/model/huber.yaml: 1.35)
    quantile: Optional[float] = None  # quantile (conf/model/quantile.yaml: 0.5)
    # sgd_regressor / sgd_classifier: scikit-learn's loss (None: squared_error / log_loss)
    sgd_loss: Optional[str] = None
    # model=onnx: the .onnx file to train (relative to the directory the command starts from) and the output to
    # train (the logits of a classifier, the prediction of a regressor; None: the graph's only output)
    path: Optional[str] = None
    output: Optional[str] = None


#: the core's trainer parameters (:data:`ortflow.trainers.parameters.TRAINERS`) that no ``trainer.*`` key sets, and what
#: sets them in the pipelines; every other parameter of every trainer is a key of the ``trainer`` group
PIPELINE_SET = {
    "model_onnx": "the graph of convert (add_loss's for trainer=full)",
    "learning_rate": "the optimizer object of trainer.optimizer and its settings (trainer.learning_rate is its eta0)",
    "lr_schedule": "trainer.lr_schedule, a setting of the optimizer object",
    "power_t": "trainer.power_t, a setting of the optimizer object",
    "callbacks": "the train stage's (MLflow metrics, checkpoints)",
    "exc": "always True: a diverging run ends FAILED",
    "learning_loss": "the loss group", "learning_penalty": "the penalty group",
    "loss_output_name": "add_loss's graph: 'loss'", "label_name": "add_loss's graph: 'label'",
    "sample_weight_name": "none: the pipelines train without sample weights",
    "weight_name": "none: the pipelines train without sample weights",
    "output_name": "the trained output of convert's graph (model.output for model=onnx)",
    "validation_fraction": "data.validation_fraction: the split's validation part",
    "warm_start": "each train run fits once; trainer.resume_from continues a training",
}
#: ``trainer.<key>`` named otherwise than the core's trainer parameter it sets
TRAINER_RENAMED = {"seed": "random_state"}
#: the pipelines' defaults where they differ from the core's (``verbose`` None: a progress bar when stdout is a
#: terminal, :func:`pipelines.base.builders.trainer_verbose`)
TRAINER_DEFAULTS = {"max_iter": 20, "batch_size": 32, "random_state": "${seed}", "verbose": None}
#: ``trainer.<key>`` named otherwise than the optimizer parameter it sets: the rate is an optimizer's ``eta0``, and
#: the schedule is what SGD's constructor calls ``learning_rate`` (onnxcustom's name)
OPTIMIZER_RENAMED = {"learning_rate": "eta0", "lr_schedule": "learning_rate"}
#: the pipelines' own keys of the ``trainer`` group, no parameter of a trainer nor of an optimizer
PIPELINE_TRAINER_KEYS = (
    # N > 0: a checkpoint every N epochs and after the last, each logged under the run's checkpoint/ at once
    ("checkpoint_every", int, 0),
    # data=parquet: also a checkpoint inside an epoch, at the first chunk boundary after every N rows trained (a
    # run killed mid-epoch resumes there); needs checkpoint_every > 0
    ("checkpoint_every_rows", Optional[int], None),
    # continue a training from a checkpoint folder, or from a logged one: runs:/<train run id>/checkpoint, or just
    # <train run id> (a run killed while RUNNING is then marked KILLED, tagged ortflow.resumed_by)
    ("resume_from", Optional[str], None),
)


def _config_type(annotation: Any, default: Any) -> Any:
    """The type OmegaConf types a key with: a union of several types (OmegaConf 2.3 has none) is ``Any``, checked
    by the core's own check of the parameter (:func:`pipelines.base.checks.check_trainer`); None allowed when the
    default is None."""
    args = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
    if getattr(annotation, "__origin__", None) is Union and len(args) > 1:
        return Any
    if default is None and getattr(annotation, "__origin__", None) is not Union:
        return Optional[annotation]
    return annotation


def _field(annotation: Any, default: Any) -> tuple:
    kind = _config_type(annotation, default)
    if isinstance(default, list):
        return kind, field(default_factory=lambda: list(default))
    return kind, field(default=default)


def optimizer_settings() -> dict[str, tuple[str, Any, Any]]:
    """Every constructor parameter of an optimizer of ortflow's registry (family ``optimizer``), as
    ``trainer.<key>`` (through :data:`OPTIMIZER_RENAMED`) -> (the parameter, its type, the key's default). The
    rate's default is the pipelines' 0.01; any other key is None by default: unset, the class keeps its own
    default. Two optimizers naming a parameter alike share its key (``trainer.epsilon``: Adam's, Adagrad's...)."""
    import inspect

    from ortflow.registry import family

    keys = {param: key for key, param in OPTIMIZER_RENAMED.items()}
    found: dict[str, tuple[str, Any, Any]] = {"learning_rate": ("eta0", float, 0.01),
                                              "lr_schedule": ("learning_rate", Schedule, None)}
    for cls in family("optimizer").values():
        for param in inspect.signature(cls.__init__).parameters.values():
            key = keys.get(param.name, param.name)
            if param.name == "self" or key in found or param.default is inspect.Parameter.empty:
                continue
            kind = float if isinstance(param.default, (int, float)) and not isinstance(param.default, bool) \
                else type(param.default)
            found[key] = (param.name, kind, None)
    return found


def _trainer_config() -> type:
    """``TrainerConfig``, generated: ``name``, the optimizer's keys (:data:`OPTIMIZER_SETTINGS`), every parameter of
    the core's trainer tables (:data:`ortflow.trainers.parameters.TRAINERS`) but :data:`PIPELINE_SET`, typed and defaulted
    as the core declares it (:data:`TRAINER_DEFAULTS` where the pipelines differ; None, unset, where a trainer
    does not take it), and :data:`PIPELINE_TRAINER_KEYS`."""
    from ortflow.trainers.parameters import TRAINERS as TABLES

    params: dict[str, Any] = {}
    for table in TABLES.values():
        for p in table:
            params.setdefault(p.name, p)
    everywhere = set.intersection(*({p.name for p in table} for table in TABLES.values()))
    renamed = {param: key for key, param in TRAINER_RENAMED.items()}
    # trainer.optimizer: a name of ortflow's registry (family "optimizer"), built with the trainer.<key> settings
    # its class takes
    fields: list[tuple] = [("name", TrainerKind, field(default=MISSING)), ("optimizer", str, field(default="sgd"))]
    optimizer = OPTIMIZER_SETTINGS
    fields += [(key, *_field(kind, default)) for key, (_, kind, default) in optimizer.items()]
    for p in params.values():
        if p.name in PIPELINE_SET:
            continue
        key = renamed.get(p.name, p.name)
        if key in optimizer:
            raise TypeError(f"trainer.{key} would set both the optimizer's {optimizer[key][0]} and the trainers' "
                            f"{p.name}: rename one in OPTIMIZER_RENAMED or TRAINER_RENAMED")
        default = TRAINER_DEFAULTS.get(p.name, p.default if p.name in everywhere else None)
        kind = int if p.name == "random_state" else p.type  # the seed: an int, ${seed} by default
        fields.append((key, *_field(kind, default)))
    fields += [(key, *_field(kind, default)) for key, kind, default in PIPELINE_TRAINER_KEYS]
    return make_dataclass("TrainerConfig", fields, namespace={"__doc__": _TRAINER_DOC, "__module__": __name__})


_TRAINER_DOC = """The trainer's settings (``trainer.<key>``), generated from the core's parameter tables
(:data:`ortflow.trainers.parameters.TRAINERS`) and the optimizers of ortflow's registry (:func:`optimizer_settings`): every
core setting but :data:`PIPELINE_SET` is a key. A key left None is not passed: the part it belongs to keeps its own
default. A key given a value that the chosen trainer or optimizer does not take is refused by
:func:`pipelines.base.checks.validate`, as is a value the core's check of the parameter refuses."""

#: the optimizer keys of the ``trainer`` group, read once (an optimizer registered later keeps its defaults)
OPTIMIZER_SETTINGS = optimizer_settings()
#: the ``trainer`` group's schema (:func:`_trainer_config`)
TrainerConfig = _trainer_config()


@dataclass
class MlflowConfig:
    """Where runs go. Environment variables win: MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME/ID, MLFLOW_RUN_ID."""

    tracking_uri: Optional[str] = None  # None: sqlite:///<root>/mlflow.db
    root: Optional[str] = None  # None: the directory the command was started from
    artifact_root: Optional[str] = None  # None: <root>/mlartifacts (local stores only)
    experiment_name: str = "ortflow"
    run_name: Optional[str] = None
    # a table's adds its target and a digest of what makes its problem (ortflow.problem: file_problem)
    registered_model_name: str = "ortflow-${data.name}-${model.name}${ortflow.problem:${data}}"
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
    # a challenger takes the alias only when it beats the holder by more than max(min_absolute_improvement,
    # min_relative_improvement * |holder's value|): a difference within float noise keeps the holder
    min_relative_improvement: float = 1e-3
    min_absolute_improvement: float = 1e-6


@dataclass
class SourceConfig:
    """Input of a stage run alone: an earlier stage's run id, or a folder/file holding its outputs."""

    run_id: Optional[str] = None
    path: Optional[str] = None


@dataclass
class Config:
    data: DataConfig = MISSING
    # model= left unchosen (conf/config.yaml): its option follows data.task (see follow_task)
    model: ModelConfig = field(default_factory=ModelConfig)
    # loss.name: a name of ortflow's registry (family "loss"), None: the model's own loss (ortflow.objectives.estimator_loss);
    # the other keys are the settings of the loss's class (its constructor's parameters), checked by validate()
    loss: Dict[str, Any] = field(default_factory=lambda: {"name": None})
    # penalty.name: a name of ortflow's registry (family "penalty"); the other keys are the settings of its class
    # (``weights``, when its class takes it and it is unset: the graph's weight matrices, coef or every coef_<i>)
    penalty: Dict[str, Any] = field(default_factory=lambda: {"name": "none"})
    trainer: TrainerConfig = MISSING
    mlflow: MlflowConfig = MISSING
    promotion: PromotionConfig = MISSING
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    source: SourceConfig = field(default_factory=SourceConfig)
    # the stages pipelines.main runs, in order: by default every stage of the table (pipelines/base/stages.py)
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


#: the option model= takes for each data.task when neither the command line nor an experiment picks one
TASK_MODEL = {"regression": "linear", "classification": "logistic"}


def follow_task(cfg: DictConfig) -> dict[str, str]:
    """Give ``model`` its option of :data:`TASK_MODEL` for ``data.task`` when none was chosen (its ``name`` is
    missing): the option's file under ``conf/``, with the keys the command line or an experiment set (those that
    differ from the schema's defaults) on top. An explicit choice is kept as it is, a contradictory one is refused
    by :func:`validate` naming both. Returns the options it picked."""
    picked: dict[str, str] = {}
    if OmegaConf.is_missing(cfg.data, "task") or not OmegaConf.is_missing(cfg.model, "name"):
        return picked
    option = TASK_MODEL[plain_value(cfg.data.task)]
    defaults = OmegaConf.to_container(OmegaConf.structured(ModelConfig), resolve=False)
    current = OmegaConf.to_container(cfg.model, resolve=False, enum_to_str=True)
    given = {k: v for k, v in current.items() if v != "???" and v != plain_value(defaults.get(k))}
    cfg.model = OmegaConf.merge(OmegaConf.structured(ModelConfig),
                                OmegaConf.load(Path(CONFIG_DIR) / "model" / f"{option}.yaml"), given)
    picked["model"] = option
    return picked


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


def file_problem(data) -> str:
    """What the default registered-model name adds for a table of one's own (the ``ortflow.problem`` resolver): ``-``
    the target (as :func:`file_stem` reduces a name) ``-`` 8 hex digits of the loader, the file's suffix, the task,
    the target and the features (sorted; all when unset), so that the same file with another target, format or
    features names another model, while a rerun of one problem registers versions of one model; nothing for a
    bundled data set (one problem per name)."""
    import hashlib
    import json

    if data.get("target") is None or data.get("path") is None:
        return ""
    features = data.get("features")
    problem = {"loader": str(data.get("loader")), "suffix": Path(str(data.path)).suffix.lower(),
               "task": str(data.get("task")), "target": str(data.target),
               "features": None if features is None else sorted(str(f) for f in features)}
    digest = hashlib.sha256(json.dumps(problem, sort_keys=True).encode()).hexdigest()[:8]
    target = "".join(c if c.isalnum() or c in "_.-" else "_" for c in str(data.target))[:40]
    return f"-{target}-{digest}"


def data_loader(data: DictConfig) -> str:
    """The loader of ``data``: ``data.loader``, else the one named like ``data.name``; a ConfigError otherwise."""
    loader = plain_value(data.loader) if data.loader is not None else str(data.name)
    if loader not in {k.value for k in DataKind}:
        raise ConfigError(f"data.name={data.name!r} is not a built-in data set ({[k.value for k in DataKind]}) and "
                          "data.loader is not set: for your own table use data=file data.path=<file> "
                          "data.target=<column> (data.name=<name> names it)")
    return loader


def plain_value(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def to_container(cfg: DictConfig) -> dict:
    """The resolved config as plain Python values (enums as strings)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def task_of(cfg: DictConfig) -> str:
    return plain_value(cfg.data.task)
