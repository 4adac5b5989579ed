"""Stage ``train``: train the ONNX graph with ortflow's trainer (``trainer=``), from the scikit-learn weights.

``trainer=full`` trains ``model_with_loss.onnx`` with :class:`ortflow.OrtGradientOptimizer`; ``trainer=fwbw``
trains ``model.onnx`` with :class:`ortflow.OrtGradientForwardBackwardOptimizer` and the configured loss;
``trainer=torch`` trains ``model.onnx`` as a torch layer with :class:`ortflow.TorchTrainer` and the same loss.
Logs the losses of every epoch (step = epoch, written in batches), every graph the trainer used, the trained
prediction graph, the history and a loss-curve PNG. With ``data=parquet`` the epochs and the validation stream
the parts of the table (``fit(source, validation_data=source)``), standardized as ``convert``'s sample was. A
diverging run (non-finite loss) ends FAILED.

    python -m pipelines.train source.run_id=<add_loss run> trainer=fwbw trainer.optimizer=nesterov
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence

import numpy as np
import onnx
from omegaconf import DictConfig

import ortflow

from ..modeling import plots
from .. import tracking as tr
from ..tracking.checkpoints import MarkResumed, MlflowCheckpoint, resume_point
from ..base.builders import adds_loss, loss, penalty, trainer_arguments
from ..base.schema import TRAINERS
from ..data.datasets import Split
from ..execution.runner import StageContext


def build_trainer(cfg: DictConfig, graph: onnx.ModelProto, callbacks: list):
    """The estimator of ``trainer.name`` (:data:`pipelines.base.schema.TRAINERS`), built the same way for the three:
    its parameters from ``trainer`` (:func:`pipelines.base.builders.trainer_arguments`), the loss and penalty from the
    registry for the trainers that add the loss themselves (full training has them in its graph already)."""
    params = trainer_arguments(cfg, callbacks)
    if not adds_loss(cfg):
        return TRAINERS[str(cfg.trainer.name)](graph, loss_output_name="loss", **params)
    # the same loss and penalty as add_loss writes into the full trainer's graph
    weights = [i.name for i in graph.graph.initializer]
    params.update(learning_loss=loss(cfg, graph), learning_penalty=penalty(cfg, weights))
    return TRAINERS[str(cfg.trainer.name)](graph, **params)


def train(ctx: StageContext, callbacks: Sequence[ortflow.Callback] = ()) -> dict:
    """The stage; ``callbacks`` join the trainer's own (MLflow metrics, checkpoints)."""
    cfg = ctx.cfg
    split = Split.load(ctx.bundle.path("split", ctx.name))
    full = str(cfg.trainer.name) == "full"
    graph = ctx.bundle.load_onnx("model_with_loss" if full else "model", ctx.name)
    logger = tr.MlflowMetricsCallback(ctx.tracking, ctx.run_id, flush_every=int(cfg.mlflow.metrics_flush_every),
                                   flush_seconds=float(cfg.mlflow.metrics_flush_seconds))
    trainer_callbacks = [logger, *callbacks]
    if cfg.trainer.checkpoint_every > 0:
        # each checkpoint is also logged under the run's checkpoint/ (in the background): a killed run resumes
        trainer_callbacks.append(MlflowCheckpoint(ctx.work_dir / "checkpoint", int(cfg.trainer.checkpoint_every),
                                                  ctx.tracking, ctx.run_id,
                                                  every_rows=cfg.trainer.checkpoint_every_rows))
    resume = resume_point(ctx)  # trainer.resume_from: downloaded, checked, and this run tagged
    if resume is not None and resume.run_id:
        trainer_callbacks.append(MarkResumed(ctx.tracking, resume.run_id, ctx.run_id))  # the killed run ends KILLED
    estimator = build_trainer(cfg, graph, trainer_callbacks)
    ctx.set_tags(device_tags(estimator))
    if split.streamed:  # data=parquet: epochs and validation read the parts chunk by chunk, prepared as the sample
        parts = split.stream_parts()
        X, y = split.prepared(parts["train"]), None
        validation = split.prepared(parts["validation"], "validation") if "validation" in parts else None
    else:
        X, y = split.X_train, split.y_train
        validation = (split.X_valid, split.y_valid) if split.has_validation else None

    resume_from = resume.folder if resume is not None else None
    begin = time.perf_counter()
    try:
        estimator.fit(X, y, validation_data=validation, resume_from=resume_from)
    except ortflow.ConvergenceError:
        logger.wait()
        history = getattr(estimator, "history_", [])
        ctx.set_tags({"ortflow.diverged": "true"})
        if history:
            ctx.log_file(plots.loss_curves(history, ctx.work_dir / "plots" / "loss_curves.png",
                                           title="loss (diverged)"), "plots")
        raise
    fit_seconds = time.perf_counter() - begin
    in_loop_seconds = logger.loop_seconds

    # Everything is saved locally first, so a tracking store lost now loses nothing; then logged while the
    # epoch metrics are being written in the background.
    history = estimator.history_
    paths = estimator.save_onnx_graph(ctx.work_dir / "graphs")
    (ctx.work_dir / "history.json").write_text(json.dumps(history, indent=1, default=_json_default))
    curves = plots.loss_curves(history, ctx.work_dir / "plots" / "loss_curves.png",
                               title=f"{cfg.model.name} / trainer={cfg.trainer.name}")
    with _kept_locally_if_store_lost(ctx, logger):
        if hasattr(estimator, "n_threads_"):  # the threads fit chose (n_threads=None: by the work)
            tr.log_param(ctx.tracking, ctx.run_id, "trainer.n_threads_", estimator.n_threads_)
        for name, path in sorted(paths.items()):
            ctx.log_file(path, "graphs", entry="trained_model" if name == "trained_model" else None)
        ctx.log_file(ctx.work_dir / "history.json", "history")
        ctx.log_file(curves, "plots")
        logger.wait()

    train_losses = [r["train_loss"] for r in history]
    valid_losses = [r["validation_loss"] for r in history if r.get("validation_loss") is not None]
    n_epochs = len(history)
    summary = {
        "n_epochs": n_epochs,
        "final_train_loss": train_losses[-1] if train_losses else None,
        "best_validation_loss": min(valid_losses) if valid_losses else None,
        "time_fit_seconds": fit_seconds,
        "time_per_epoch_seconds": fit_seconds / max(n_epochs, 1),
        # time the epoch loop spent in the MLflow callback, and all tracking time (loop + final wait)
        "tracking_in_loop_seconds": in_loop_seconds,
        "tracking_overhead_seconds": logger.overhead_seconds,
        "tracking_in_loop_fraction": in_loop_seconds / fit_seconds if fit_seconds > 0 else 0.0,
        "tracking_overhead_fraction": logger.overhead_seconds / fit_seconds if fit_seconds > 0 else 0.0,
        "metric_flushes": logger.flushes,
    }
    ctx.log_metrics(summary)
    # the per-epoch histories are logged with steps; the chain and Optuna read the final values from here
    ctx.metrics["train_loss"] = train_losses[-1] if train_losses else None
    ctx.metrics["validation_loss"] = valid_losses[-1] if valid_losses else None
    (ctx.work_dir / "train_summary.json").write_text(json.dumps(
        {**summary, "train_loss": ctx.metrics["train_loss"], "validation_loss": ctx.metrics["validation_loss"],
         "trainer": type(estimator).__name__}, indent=1, default=_json_default))
    ctx.log_file(ctx.work_dir / "train_summary.json", None, entry="train_summary")
    return ctx.metrics


def device_tags(estimator) -> dict[str, str]:
    """Where the trainer runs, as run tags: the device (``auto`` resolved), the GPU's name (``none`` on CPU or
    when unknown: nvidia-ml-py names it), the float32 precision of CUDA products and the onnxruntime build."""
    from ortflow.runtime.validation import device_index, resolve_device

    device = resolve_device(estimator.device)
    info = ortflow.device_info(device_index(device) if device.startswith("cuda") else 0)
    build = f"{info['package']} {info['version']}"
    if info["cuda_version"]:
        build += f" (CUDA {info['cuda_version']}, cuDNN {info['cudnn_version']})"
    return {"ortflow.device": device, "ortflow.gpu": (device != "cpu" and info["gpu"]) or "none",
            "ortflow.precision": str(getattr(estimator, "precision", "fp32")), "ortflow.onnxruntime": build}


@contextlib.contextmanager
def _kept_locally_if_store_lost(ctx: StageContext, logger: tr.MlflowMetricsCallback) -> Iterator[None]:
    """Turn a tracking store that stays away into a :class:`TrackingUnavailableError` that says where the
    trained model, the graphs and the epoch metrics not stored were kept."""
    try:
        yield
    except Exception as exc:
        if not tr.is_transient(exc):
            raise
        spool = ctx.work_dir / "unsent_metrics.json"
        lost = (f"the tracking store {ctx.tracking.uri} stopped answering during stage 'train' "
                f"({str(exc).splitlines()[0][:300]})")
        count = logger.spool(spool, f"TrackingUnavailableError: {lost}; outputs kept in {ctx.work_dir}")
        raise tr.TrackingUnavailableError(
            f"{lost}. Training finished and nothing is lost: the trained model and every graph are in "
            f"{ctx.work_dir / 'graphs'}, the epoch history in {ctx.work_dir / 'history.json'}, and the {count} "
            f"epoch metric points not stored in {spool} (`python -m pipelines.resend {spool}` sends them and "
            "marks the run FAILED once the store is back)") from exc


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
