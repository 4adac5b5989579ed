"""MLflow for library users: :class:`MlflowLogger`, an ``ortflow`` callback that records a fit in a notebook or a
script, without the pipelines::

    import mlflow
    from ortflow import OrtGradientOptimizer
    from pipelines.tracking.logger import MlflowLogger

    mlflow.set_tracking_uri("sqlite:///mlflow.db")
    trainer = OrtGradientOptimizer(model_with_loss, max_iter=50, callbacks=[MlflowLogger(input_example=X[:5])])
    trainer.fit(X, y)      # one run: params, per-epoch curves, the trained graph as an ONNX model with signature

The run is the active one when training begins (``with mlflow.start_run(): trainer.fit(...)``), or ``run_id``, or
else a new run in the current experiment that the logger ends when training ends (FAILED when training diverged,
KILLED when it was interrupted mid-epoch). Parameters are the trainer's ``get_params()`` (the graph and objects as
a short description); the epoch records go through :class:`.epoch_metrics.MlflowMetricsCallback` (buffered,
written in the background; ``train_loss``, ``validation_loss``, ``learning_rate``, ``epoch_time_seconds``, step =
epoch). At the end, unless training diverged, ``trainer.get_trained_onnx()`` is logged with ``mlflow.onnx`` under
``model_name``: its signature comes from the graph's inputs and outputs (tensors), its requirements name the plain
onnxruntime (:func:`.deploy.pip_requirements`), and ``input_example`` (raw rows, optional) is stored with it.
A fit on a DataFrame (a graph with one input per column, or a frame as ``input_example``) logs the pipelines'
served model (:func:`.deploy.log_deploy_model`) instead, which takes the frame's columns (:func:`table_model_config`).
``model_info_`` is the logged model's ``ModelInfo``. A model that cannot be logged fails the fit with the cause,
and the logger's own run ends FAILED.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import onnx
from mlflow import MlflowClient
from mlflow.models import Model, ModelSignature
from mlflow.types import Schema, TensorSpec

from ortflow.trainers.callbacks import Callback

from .epoch_metrics import MlflowMetricsCallback
from .records import MAX_PARAM_LENGTH
from .retries import RetryingClient
from .store import Tracking


def _describe(value: Any) -> str:
    """A parameter's value as MLflow shows it: plain values as they are, a graph or an object by what it is."""
    if isinstance(value, onnx.ModelProto):
        return f"ModelProto {value.graph.name or '(unnamed)'} ({len(value.graph.node)} nodes)"
    if value is None or isinstance(value, (bool, int, float, str)):
        return str(value)
    text = repr(value)
    return text if len(text) <= MAX_PARAM_LENGTH else f"{type(value).__name__} ({len(text)} characters)"


def _tensor_specs(values: list[onnx.ValueInfoProto]) -> Schema:
    specs = []
    for value in values:
        tensor = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        specs.append(TensorSpec(np.dtype(dtype), shape or (-1,), value.name))
    return Schema(specs)


def graph_signature(graph: onnx.ModelProto) -> ModelSignature:
    """The signature an ONNX graph declares: one tensor per input and output, unknown dimensions as -1."""
    return ModelSignature(inputs=_tensor_specs(list(graph.graph.input)),
                          outputs=_tensor_specs(list(graph.graph.output)))


class MlflowLogger(Callback):
    """Log a trainer's parameters, per-epoch curves and trained graph to MLflow (see the module's docstring).

    ``run_id``: log into this run (default: the active run, else a new one); ``model_name``: the logged model's
    name (None: no model); ``input_example``: rows of X stored with the model; ``registered_model_name``: also
    register the model under this name; ``flush_seconds``: how often buffered epochs are written.
    """

    def __init__(self, run_id: str | None = None, model_name: str | None = "model", input_example: Any = None,
                 registered_model_name: str | None = None, flush_seconds: float = 10.0):
        self.run_id = run_id
        self.model_name = model_name
        self.input_example = input_example
        self.registered_model_name = registered_model_name
        self.flush_seconds = flush_seconds

    def on_train_begin(self, trainer: Any) -> None:
        active = mlflow.active_run()
        self._own_run = self.run_id is None and active is None
        run = mlflow.start_run() if self._own_run else None
        self.run_id_ = self.run_id or (run or active).info.run_id
        uri = mlflow.get_tracking_uri()
        client = RetryingClient(MlflowClient(uri))
        experiment_id = client.get_run(self.run_id_).info.experiment_id
        self._tracking = Tracking(uri, client, experiment_id, client.get_experiment(experiment_id).name,
                                  Path.cwd(), retries=client.retries)
        client.log_batch(self.run_id_, params=[
            mlflow.entities.Param(k, _describe(v)) for k, v in sorted(trainer.get_params(deep=False).items())
            if k != "callbacks"] + [mlflow.entities.Param("trainer", type(trainer).__name__)])
        self._metrics = MlflowMetricsCallback(self._tracking, self.run_id_, flush_seconds=self.flush_seconds)
        self._metrics.on_train_begin(trainer)
        self.model_info_ = None

    def on_epoch_end(self, trainer: Any, record: dict) -> None:
        self._metrics.on_epoch_end(trainer, record)

    def on_train_end(self, trainer: Any) -> None:
        self._metrics.on_train_end(trainer)
        status = ("FAILED" if getattr(trainer, "diverged_", False)
                  else "KILLED" if getattr(trainer, "in_epoch_", False) else "FINISHED")
        try:
            if status == "FINISHED" and self.model_name:
                try:
                    self.model_info_ = self._log_model(trainer)
                except Exception as exc:  # the run says why it has no model, then the fit fails with the cause
                    status = "FAILED"
                    self._tracking.client.set_tag(self.run_id_, "ortflow.model",
                                                  f"not logged: {type(exc).__name__}: {exc}"[:MAX_PARAM_LENGTH])
                    raise
            else:
                self._tracking.client.set_tag(self.run_id_, "ortflow.model", f"not logged: training {status}")
            self._metrics.wait()
        finally:
            if self._own_run:
                mlflow.end_run(status=status)

    def _log_model(self, trainer: Any):
        from .deploy import pip_requirements

        graph = trainer.get_trained_onnx()
        example = self.input_example
        if _is_frame(example) or len(graph.graph.input) > 1:  # a table: the model takes the frame's columns
            return self._log_table_model(graph, example)
        if example is not None and not isinstance(example, dict):
            example = np.asarray(example, dtype=np.float32)
        return self._tracking.call(
            Model.log, artifact_path=None, name=self.model_name, flavor=mlflow.onnx, run_id=self.run_id_,
            onnx_model=graph, signature=graph_signature(graph), input_example=example,
            pip_requirements=pip_requirements(graph), registered_model_name=self.registered_model_name)

    def _log_table_model(self, graph: onnx.ModelProto, example: Any):
        """The served model of the pipelines (:class:`.serving_model.DeployedOnnxModel`) on the trained graph: it
        takes the columns as the trainer took them (text, numbers with gaps, dates), checks each cell, and its
        signature's inputs are the frame's columns (``input_example``'s, when given)."""
        import tempfile

        from .deploy import log_deploy_model

        config = table_model_config(graph, example)
        with tempfile.TemporaryDirectory(prefix="ortflow-logger-") as folder:
            path = Path(folder) / "trained_model.onnx"
            onnx.save(graph, path)
            return log_deploy_model(self._tracking, self.model_name, path, config, example, run_id=self.run_id_,
                                    registered_model_name=self.registered_model_name)


def _is_frame(value: Any) -> bool:
    return type(value).__name__ == "DataFrame" and hasattr(value, "dtypes")


def table_model_config(graph: onnx.ModelProto, frame: Any = None) -> dict:
    """What :class:`.serving_model.DeployedOnnxModel` reads for a graph taking one input per column: each
    column's kind from ``frame`` (:func:`ortflow.data.preprocessing.column_kinds`), else from the graph (text for a
    string input, a date for an int64 input that reaches ``ortflow.convert.tables.DateParts``' nodes, a number otherwise);
    the task and classes from its outputs."""
    from ortflow.convert.sklearn import graph_classes
    from ortflow.data.preprocessing import TEXT_MISSING, column_kinds

    inputs = [i.name for i in graph.graph.input]
    if frame is not None:
        missing = [name for name in inputs if name not in frame.columns]
        if missing:
            raise ValueError(f"input_example lacks the columns {missing} the trained graph takes ({inputs})")
        kinds = column_kinds(frame[inputs])
    else:
        kinds = {value.name: _graph_kind(graph, value) for value in graph.graph.input}
    outputs = [o.name for o in graph.graph.output]
    config = {"features": inputs, "columns": kinds, "text_missing": TEXT_MISSING, "task": "regression"}
    classes = graph_classes(graph)
    if classes is not None and {"output_label", "output_probability"} <= set(outputs):
        config.update(task="classification", classes=classes.tolist())
    return config


def _graph_kind(graph: onnx.ModelProto, value: onnx.ValueInfoProto) -> str:
    elem = value.type.tensor_type.elem_type
    if elem == onnx.TensorProto.STRING:
        return "text"
    if elem != onnx.TensorProto.INT64:
        return "number"
    reached, frontier = {value.name}, [value.name]
    while frontier:  # the results computed from this input: a date reaches DateParts' nodes
        name = frontier.pop()
        for node in graph.graph.node:
            if name in node.input:
                if node.name.startswith("DateParts"):
                    return "date"
                for out in node.output:
                    if out not in reached:
                        reached.add(out)
                        frontier.append(out)
    return "number"
