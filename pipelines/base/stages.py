"""The stage table: every stage declared once, in :data:`TABLE`, and what derives from it.

A stage is a function ``fn(ctx: StageContext) -> dict`` of summary metrics, named like the stage, in its own
module (``pipelines/stages/<name>.py`` unless ``module`` says otherwise), imported on first use; one line of
:data:`TABLE` declares it. The stage names (``cfg.stages`` is checked against them, in this order), the files the
stages hand to each other (:data:`pipelines.execution.bundle.FILES`), the data parts logged as dataset inputs
(:data:`pipelines.tracking.lineage.STAGE_INPUTS`), ``python -m pipelines <stage>``, ``MLproject``'s entry points
(:mod:`pipelines.mlproject`) and the ``--help`` listing all read the table. A stage module imports no other stage
module: what two stages share lives in a lower layer (``pipelines/modeling/``, ``data/``, ``execution/``).

This module imports nothing heavy: the entry points read it before the config is composed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


#: the package of the stage modules
STAGES_PACKAGE = "pipelines.stages"


@dataclass(frozen=True)
class Stage:
    """One stage: its name (also its function's), a one-line summary, the bundle entries it writes (entry name
    -> file name), the parts of the split it reads (logged as dataset inputs), the module holding it and the
    config keys it reads (a group or a key; shown by its ``--help``, besides ``source``, ``mlflow`` and ``seed``
    that every stage reads)."""

    name: str
    summary: str
    writes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    data_parts: tuple[str, ...] = ()
    module: str = ""
    reads: tuple[str, ...] = ()

    @property
    def module_name(self) -> str:
        return self.module or f"{STAGES_PACKAGE}.{self.name}"


#: the stages, in the order ``python -m pipelines main`` runs them
TABLE: list[Stage] = [
    Stage("convert", "load and split the data, fit the scikit-learn model, convert it to ONNX",
          {"split": "split.npz", "sklearn_reference": "sklearn_reference.npz", "model": "model.onnx"},
          ("train", "validation", "test"), reads=("data", "model")),
    Stage("add_loss", "append the loss (and penalty) to the graph", {"model_with_loss": "model_with_loss.onnx"},
          reads=("loss", "penalty", "trainer.name")),
    Stage("train", "train the graph with the configured ortflow trainer",
          {"trained_model": "trained_model.onnx", "train_summary": "train_summary.json"}, ("train", "validation"),
          reads=("trainer", "loss", "penalty", "optimized_metric")),
    Stage("evaluate", "test metrics and plots of the deployable graph",
          {"deploy_model": "deploy_model.onnx", "evaluation": "evaluation.json"}, ("test",), reads=("data.task",)),
    Stage("export", "log the MLflow model, register a version, promote it", {}, ("test",), reads=("promotion",)),
]


def names() -> tuple[str, ...]:
    """The stage names, in order."""
    return tuple(s.name for s in TABLE)


def stage(name: str) -> Stage:
    """The table's line of ``name``; a KeyError listing the stages otherwise."""
    for s in TABLE:
        if s.name == name:
            return s
    raise KeyError(f"unknown stage {name!r}; stages are {list(names())}")


def stage_function(name: str) -> Callable:
    """The function of stage ``name`` (its module imported now)."""
    return getattr(importlib.import_module(stage(name).module_name), name)


class Derived(Mapping):
    """A read-only mapping computed from :data:`TABLE` at each look-up (a stage added to the table shows)."""

    def __init__(self, build: Callable[[], dict]):
        self._build = build

    def __getitem__(self, key: str):
        return self._build()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._build())

    def __len__(self) -> int:
        return len(self._build())

    def __repr__(self) -> str:
        return repr(self._build())


#: bundle entry -> the file its stage writes it under
FILES = Derived(lambda: {entry: file for s in TABLE for entry, file in s.writes.items()})
#: bundle entry -> the stage that writes it
PRODUCER = Derived(lambda: {entry: s.name for s in TABLE for entry in s.writes})
#: stage -> the parts of the split it reads (the stages not named read no data)
DATA_PARTS = Derived(lambda: {s.name: s.data_parts for s in TABLE if s.data_parts})
