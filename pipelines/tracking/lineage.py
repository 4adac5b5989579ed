"""Lineage: the data each stage run used, and where the code came from.

- :func:`log_split_inputs` logs the train, validation and test parts a stage used as MLflow dataset inputs
  (``mlflow.data.from_pandas``: source, digest, schema and profile; the context ``training``, ``validation`` or
  ``testing``): the raw features under their names plus the target, as the registered model sees them. A
  streamed table (``data=parquet``) is never read for it: each part is a ``MetaDataset`` of the files (their
  digest, the schema, the rows from the footers, :func:`stream_lineage` for the tags ``ortflow.data.*``).
- :func:`source_tags` are the tags ``mlflow run`` gives its run (``mlflow.user``, ``mlflow.source.name``,
  ``mlflow.source.type``, ``mlflow.source.git.commit``): MLflow's own context providers, for the runs the
  pipelines create themselves (``python -m pipelines...``).
- :func:`logged_model_name`: what the exported model is called (its LoggedModel), after the registered model.
- :func:`version_run`: the run that registered a model version; :func:`tag_version` records a version's lineage
  (the states imported into it, the version they were trained from: :data:`LINEAGE_TAG`).
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from omegaconf import DictConfig

from ..base.schema import DataKind, data_loader
from ..base.stages import DATA_PARTS

if TYPE_CHECKING:
    from ..data.datasets import Split
    from .store import Tracking

#: the prefix of the tags naming where a version's weights come from (``source_version``, ``states``)
LINEAGE_TAG = "ortflow.lineage."
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
    if loader in (DataKind.file.value, DataKind.parquet.value):
        from ..base.paths import user_path

        return _local_source(str(user_path(str(data.path))))
    from mlflow.data.code_dataset_source import CodeDatasetSource

    return CodeDatasetSource({"mlflow.source.name": BUILT_IN_SOURCES.get(loader, f"pipelines.data.datasets:{loader}"),
                              "ortflow.loader": loader, "ortflow.seed": str(data.seed)})


def split_datasets(split: Split, data: DictConfig, parts: tuple[str, ...] = tuple(CONTEXTS)) -> dict:
    """``{part: PandasDataset}``: the raw features of each part under their names, and the target column
    (``data.target``, or ``target``) in the target's units (the original labels for a classifier)."""
    import mlflow.data
    import pandas as pd

    if split.streamed:
        return _stream_datasets(split, data, parts)
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


def _local_source(path: str):
    """MLflow's dataset source of a local file or folder."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    with warnings.catch_warnings():  # "file" and "" both name MLflow's local source
        warnings.simplefilter("ignore")
        return resolve_dataset_source(Path(path).resolve().as_uri())


def stream_lineage(split: Split, path: str | Path) -> dict[str, str]:
    """``data=parquet``: the table's description from its files' metadata (no row read: the files, the digest of
    their names, sizes and modification times, the schema, the row count), written to ``path`` as JSON; returns
    the ``ortflow.data.*`` tags that say it in short."""
    import json

    from ..data.streams import Stream, description

    stream = Stream.from_json(split.stream)
    table = {**description(stream), "split": json.loads(stream.to_json())}
    Path(path).write_text(json.dumps(table, indent=1))
    bands = f"test [0, {stream.test_size:g})" + (
        f", validation [{stream.test_size:g}, {stream.test_size + stream.validation_fraction:g})"
        if stream.validation_fraction > 0 else "") + ", train the rest"
    return {"ortflow.data.source": stream.path, "ortflow.data.digest": table["digest"],
            "ortflow.data.rows": str(table["n_rows"]), "ortflow.data.files": str(len(table["files"])),
            "ortflow.data.split": f"stable hash of {f'column {stream.key!r}' if stream.key else 'row positions'}: "
                                  f"{bands}"}


def _stream_datasets(split: Split, data: DictConfig, parts: tuple[str, ...]) -> dict:
    """``{part: MetaDataset}`` of a streamed table: its files as the source, a digest of the files and the part's
    hash band, the schema and, as profile, the rows (from the metadata; a part's own rows when no key splits
    it), the files and the row groups. Nothing is read but the files' footers."""
    import hashlib
    import json

    from mlflow.data.meta_dataset import MetaDataset

    from ..data.streams import Stream, description

    class StreamedDataset(MetaDataset):
        def __init__(self, *args, profile: dict, **kwargs):
            super().__init__(*args, **kwargs)
            self._profile = profile

        @property
        def profile(self):
            return self._profile

        def to_dict(self) -> dict[str, str]:
            return {**super().to_dict(), "profile": json.dumps(self._profile)}

    stream = Stream.from_json(split.stream)
    table, sources = description(stream), stream.parts()
    schema = _mlflow_schema(table["schema"])
    datasets = {}
    for part in parts:
        if part not in sources:
            continue
        digest = hashlib.sha256(f"{table['digest']}\0{part}\0{stream.to_json()}".encode()).hexdigest()[:16]
        profile = {"table_rows": table["n_rows"], "rows": sources[part].n_rows, "files": len(sources[part].files),
                   "table_files": len(table["files"]), "row_groups": table["n_row_groups"],
                   "split": f"{'key ' + stream.key if stream.key else 'by row position'}"}
        datasets[part] = StreamedDataset(_local_source(stream.path), name=f"{data.name}-{part}", digest=digest,
                                         schema=schema, profile=profile)
    return datasets


def _mlflow_schema(columns: dict[str, str]):
    """An MLflow schema from the Arrow type names of :func:`pipelines.data.streams.description`."""
    from mlflow.types import ColSpec, DataType, Schema

    def kind(arrow: str) -> DataType:
        if arrow == "bool":
            return DataType.boolean
        if arrow.startswith(("int", "uint")):
            return DataType.long if arrow.endswith("64") else DataType.integer
        if arrow in ("float", "halffloat"):
            return DataType.float
        if arrow == "double":
            return DataType.double
        return DataType.string

    return Schema([ColSpec(kind(t), name) for name, t in columns.items()])


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


def version_run(tracking: Tracking, name: str, version: str) -> tuple[str, dict[str, str]]:
    """``(run id, params)`` of the run that registered version ``version`` of the registered model ``name`` (its
    params: the flattened config it ran with); a LookupError naming both when the registry has no such version or
    it has no run."""
    from mlflow.exceptions import MlflowException

    try:
        found = tracking.client.get_model_version(name, str(version))
    except MlflowException as exc:
        raise LookupError(f"the registry of {tracking.uri} has no version {version} of the model {name!r}: "
                          f"{str(exc).splitlines()[0][:300]}") from exc
    if not found.run_id:
        raise LookupError(f"version {version} of the model {name!r} was registered from no run")
    return found.run_id, dict(tracking.client.get_run(found.run_id).data.params)


def tag_version(tracking: Tracking, name: str, version: str, tags: dict[str, str]) -> None:
    """Set ``tags`` on version ``version`` of ``name``."""
    for key, value in tags.items():
        tracking.client.set_model_version_tag(name, str(version), key, str(value)[:4900])


__all__ = ["log_split_inputs", "split_datasets", "stream_lineage", "source_tags", "logged_model_name", "STAGE_INPUTS",
           "LINEAGE_TAG", "version_run", "tag_version"]
