"""Lineage: the data each stage run used, and where the code came from.

- :func:`log_split_inputs` logs the train, validation and test parts a stage used as MLflow dataset inputs
  (``mlflow.data.from_pandas``: source, digest, schema and profile; the context ``training``, ``validation`` or
  ``testing``): the raw features under their names plus the target, as the registered model sees them.
- :func:`source_tags` are the tags ``mlflow run`` gives its run (``mlflow.user``, ``mlflow.source.name``,
  ``mlflow.source.type``, ``mlflow.source.git.commit``): MLflow's own context providers, for the runs the
  pipelines create themselves (``python -m pipelines...``).
- :func:`logged_model_name`: what the exported model is called (its LoggedModel), after the registered model.
"""

from __future__ import annotations

import functools
import warnings
from typing import TYPE_CHECKING

import numpy as np
from omegaconf import DictConfig

from ..base.config import DataKind, data_loader
from ..stages import DATA_PARTS

if TYPE_CHECKING:
    from ..data.datasets import Split
    from .store import Tracking

#: the parts of the split each stage reads (the stages not named read no data), from the stage table
STAGE_INPUTS = DATA_PARTS
#: MLflow's names of the parts (the ``mlflow.data.context`` input tag)
CONTEXTS = {"train": "training", "validation": "validation", "test": "testing"}
#: the code that makes the built-in data sets (the source of their dataset inputs)
BUILT_IN_SOURCES = {"regression": "sklearn.datasets.make_regression",
                    "classification": "sklearn.datasets.make_classification",
                    "diabetes": "sklearn.datasets.load_diabetes",
                    "breast_cancer": "sklearn.datasets.load_breast_cancer"}


def data_source(data: DictConfig):
    """The MLflow dataset source of ``data``: the table's file, or the scikit-learn function of a built-in set."""
    loader = data_loader(data)
    if loader == DataKind.file.value:
        from mlflow.data.dataset_source_registry import resolve_dataset_source

        from ..base.paths import user_path

        with warnings.catch_warnings():  # "file" and "" both name MLflow's local source
            warnings.simplefilter("ignore")
            return resolve_dataset_source(user_path(str(data.path)).resolve().as_uri())
    from mlflow.data.code_dataset_source import CodeDatasetSource

    return CodeDatasetSource({"mlflow.source.name": BUILT_IN_SOURCES.get(loader, f"pipelines.data.datasets:{loader}"),
                              "ortflow.loader": loader, "ortflow.seed": str(data.seed)})


def split_datasets(split: Split, data: DictConfig, parts: tuple[str, ...] = tuple(CONTEXTS)) -> dict:
    """``{part: PandasDataset}``: the raw features of each part under their names, and the target column
    (``data.target``, or ``target``) in the target's units (the original labels for a classifier)."""
    import mlflow.data
    import pandas as pd

    target = str(data.get("target") or "target")
    source = data_source(data)
    arrays = {"train": (split.X_train, split.y_train), "validation": (split.X_valid, split.y_valid),
              "test": (split.X_test, split.y_test)}
    datasets = {}
    for part in parts:
        X, y = arrays[part]
        if len(y) == 0:
            continue
        frame = (X.copy() if split.is_table else
                 pd.DataFrame(split.raw_rows(X).astype(np.float64), columns=[str(n) for n in split.feature_names]))
        frame[target] = _labels(split, y) if split.task == "classification" else split.raw_y(y).astype(np.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            datasets[part] = mlflow.data.from_pandas(frame, source=source, targets=target,
                                                     name=f"{data.name}-{part}")
    return datasets


def _labels(split: Split, y: np.ndarray) -> np.ndarray:
    """The original labels of a classifier's targets: ``y`` itself when it holds labels of ``split.classes``,
    else the class indices it holds mapped through ``split.classes``."""
    y = np.asarray(y)
    if not len(split.classes) or np.isin(y, split.classes).all():
        return y
    return split.classes[y.astype(np.int64)]


def log_split_inputs(tracking: Tracking, run_id: str, split: Split, data: DictConfig, stage: str) -> list[str]:
    """Log the parts of ``split`` that ``stage`` reads (:data:`STAGE_INPUTS`) as dataset inputs of ``run_id``;
    returns their contexts."""
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    datasets = split_datasets(split, data, STAGE_INPUTS.get(stage, ()))
    if not datasets:
        return []
    inputs = [DatasetInput(d._to_mlflow_entity(), tags=[InputTag(MLFLOW_DATASET_CONTEXT, CONTEXTS[part])])
              for part, d in datasets.items()]
    try:
        tracking.client.log_inputs(run_id, datasets=inputs)
    except Exception as exc:  # noqa: BLE001 - only the insert race below is retried
        # Several runs logging the same dataset at once (a sweep's workers, chains started together): the store
        # looks the dataset up, then inserts it, and a concurrent writer may insert it in between (a unique-key
        # violation). Once it exists the same call links it instead of inserting it: one more try settles it.
        text = str(exc).lower()
        if not any(marker in text for marker in ("unique", "duplicate", "integrity")):
            raise
        tracking.client.log_inputs(run_id, datasets=inputs)
    return [CONTEXTS[part] for part in datasets]


@functools.lru_cache(maxsize=1)
def _source_tags() -> tuple[tuple[str, str], ...]:
    from mlflow.tracking.context.registry import resolve_tags

    return tuple((k, v) for k, v in resolve_tags().items() if k.startswith("mlflow."))


def source_tags() -> dict[str, str]:
    """The tags MLflow's context providers give a run started by this process (user, source name and type, git
    commit and branch when the code lies in a git checkout): what ``mlflow run`` and ``mlflow.start_run`` set."""
    return dict(_source_tags())  # the same for every run of this process: asked once


def logged_model_name(cfg: DictConfig) -> str:
    """The exported model's name (its LoggedModel): the registered model's name, so the models of several data
    sets and families are told apart (MLflow refuses '/' and ':' in it)."""
    name = str(cfg.mlflow.registered_model_name)
    return "".join(c if c not in "/:" else "_" for c in name) or "model"


__all__ = ["log_split_inputs", "split_datasets", "source_tags", "logged_model_name", "STAGE_INPUTS"]
