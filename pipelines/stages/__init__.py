"""The stage functions ``fn(ctx: StageContext) -> dict``, one module each, imported on first use.

The Hydra entry points (``python -m pipelines.<stage>``) stay light, so a config error is reported before
onnxruntime, MLflow and scikit-learn are imported.
"""

from __future__ import annotations

import importlib
from typing import Callable

NAMES = ("convert", "add_loss", "train", "evaluate", "export")


def stage_function(name: str) -> Callable:
    if name not in NAMES:
        raise KeyError(f"unknown stage {name!r}; stages are {list(NAMES)}")
    return getattr(importlib.import_module(f"{__name__}.{name}"), name)
