"""The deploy graph logged as one MLflow model with two flavors: ``python_function`` (the code of
:mod:`.serving_model`, what ``mlflow.pyfunc``, ``mlflow models serve`` and ``mlflow.models.evaluate`` run) and
``onnx`` (the same file, ``artifacts/deploy_model.onnx``, for ``mlflow.onnx.load_model`` and ONNX tooling).

The signature declares outputs and the classifier's ``output`` parameter, and no input schema: MLflow's column
types would refuse an int64 column where the model takes floats, so the model checks its input itself (names,
numbers, finite values; see :mod:`.serving_model`). The requirements name the plain ``onnxruntime`` from the
first release that runs the graph's opsets (never the training build: the graph is plain ONNX).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
import onnx
import pandas as pd
from mlflow.models import Model, ModelSignature
from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

from . import serving_model
from .store import Tracking

#: the first onnxruntime release that runs each opset of the default (ai.onnx) and ai.onnx.ml domains
ORT_FOR_OPSET = {"": {13: "1.7", 14: "1.10", 15: "1.10", 16: "1.11", 17: "1.12", 18: "1.14", 19: "1.15",
                      20: "1.17", 21: "1.18"},
                 "ai.onnx.ml": {1: "1.0", 2: "1.7", 3: "1.12", 4: "1.15", 5: "1.17"}}
ONNX_FLAVOR = "onnx"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


def onnxruntime_floor(graph: onnx.ModelProto) -> str:
    """The first plain onnxruntime release that runs ``graph``'s opsets (the installed one for an opset newer than
    :data:`ORT_FOR_OPSET` knows)."""
    import onnxruntime

    floor = "1.7"
    for opset in graph.opset_import:
        known = ORT_FOR_OPSET.get(opset.domain or "")
        if known is None:  # another domain (ortflow's graphs use none): the runtime's own
            continue
        needed = known.get(opset.version) or (".".join(map(str, _version(onnxruntime.__version__)))
                                              if opset.version > max(known) else None)
        if needed and _version(needed) > _version(floor):
            floor = needed
    return floor


def pip_requirements(graph: onnx.ModelProto) -> list[str]:
    """What the served model needs, as lower bounds that resolve on any Python MLflow runs on: the plain
    onnxruntime (never a training build: the deploy graph is plain ONNX), numpy, pandas and onnx (for the onnx
    flavor). MLflow adds its own ``mlflow==<version>``."""
    return [f"onnxruntime>={onnxruntime_floor(graph)}", "onnx>=1.12", "numpy>=1.21", "pandas>=1.3"]


def signature(config: dict) -> ModelSignature:
    """Outputs and parameters only (the model checks its inputs itself, see :mod:`.serving_model`)."""
    if config["task"] == "classification":
        label = "string" if any(isinstance(c, str) for c in config["classes"]) else "long"
        return ModelSignature(outputs=Schema([ColSpec(label, "label")]), params=ParamSchema(
            [ParamSpec(serving_model.OUTPUT_PARAM, "string", serving_model.OUTPUTS[0])]))
    return ModelSignature(outputs=Schema([ColSpec("double", "prediction")]))


class _PyfuncWithOnnx:
    """A flavor module for :meth:`mlflow.models.Model.log`: ``mlflow.pyfunc.save_model``, then the ``onnx``
    flavor pointing at the pyfunc's own copy of the graph, ``artifacts/<file name>`` (one file, two flavors)."""

    __name__ = "mlflow.pyfunc"

    @staticmethod
    def save_model(path: str, mlflow_model: Model, **kwargs: Any) -> None:
        mlflow.pyfunc.save_model(path=path, mlflow_model=mlflow_model, **kwargs)
        graph = f"artifacts/{Path(kwargs['artifacts'][serving_model.GRAPH]).name}"
        if not (Path(path) / graph).is_file():
            raise FileNotFoundError(f"the pyfunc model holds no {graph}: the onnx flavor would point at nothing")
        mlflow_model.add_flavor(ONNX_FLAVOR, onnx_version=onnx.__version__, data=graph,
                                providers=["CPUExecutionProvider"], onnx_session_options=None, code=None)
        mlflow_model.save(str(Path(path) / "MLmodel"))


def log_deploy_model(tracking: Tracking, name: str, graph_path: Path, config: dict, example: pd.DataFrame | None,
                     **log_args: Any) -> Any:
    """Log the deploy graph at ``graph_path`` as the served model ``name`` into the active run, or ``run_id``
    (``config``: what :class:`.serving_model.DeployedOnnxModel` reads; ``example``: raw rows named by the features,
    whose columns the signature declares; ``log_args``: more of ``Model.log``'s arguments). MLflow runs the model
    on the example when logging, so an example that does not round-trip fails here. Returns the ``ModelInfo``."""
    graph = onnx.load(str(graph_path))
    return tracking.call(
        Model.log, artifact_path=None, name=name, flavor=_PyfuncWithOnnx,
        python_model=str(Path(serving_model.__file__)), artifacts={serving_model.GRAPH: str(graph_path)},
        model_config=config, signature=signature(config), input_example=example,
        pip_requirements=pip_requirements(graph), **log_args,
    )
