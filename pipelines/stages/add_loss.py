"""Stage ``add_loss``: append the configured loss (and weight penalty) to the prediction graph.

Output: ``model_with_loss.onnx`` (inputs X and label, first output ``loss``), what ``trainer=full`` trains.
``trainer=fwbw`` trains the prediction graph itself and computes the same loss outside onnxruntime; the graph
is still written for reference.

    python -m pipelines.add_loss source.run_id=<convert run> loss=absolute penalty=elastic
"""

from __future__ import annotations

import json

import onnx
from omegaconf import DictConfig

import ortflow

from ..base.builders import loss, penalty
from ..execution.runner import StageContext


def with_loss(cfg: DictConfig, onx: onnx.ModelProto, chosen: ortflow.BaseLearningLoss | None = None) -> onnx.ModelProto:
    """``onx`` with the configured loss (``chosen``, else built from the config) and penalty as its first output
    ``loss``: what ``trainer=full`` trains."""
    return ortflow.add_loss_output(onx, score_name=chosen or loss(cfg, onx), loss_name="loss", label_name="label",
                                   penalty=penalty(cfg, [i.name for i in onx.graph.initializer]))


def add_loss(ctx: StageContext) -> dict:
    cfg = ctx.cfg
    graph = ctx.bundle.load_onnx("model", ctx.name)
    chosen = loss(cfg, graph)
    with_loss_graph = with_loss(cfg, graph, chosen)
    path = ctx.work_dir / "model_with_loss.onnx"
    onnx.save(with_loss_graph, path)
    ctx.log_file(path, "graphs", entry="model_with_loss")
    ctx.set_tags({"ortflow.loss": chosen.names[0], "ortflow.loss_settings": json.dumps(chosen.get_params()),
                  "ortflow.penalty": str(cfg.penalty.name),
                  "ortflow.loss_graph_used_for_training": str(str(cfg.trainer.name) == "full").lower()})
    return ctx.metrics
