"""One function per engine: train a case's model from its initial weights and time every epoch.

``train(name, case, data, epochs, threads)`` returns a :class:`Run` with the set-up time (building graphs and
sessions, not counted in the epoch times), the wall time of each epoch and the training loss of each epoch (the
row-weighted mean of the batch losses seen during the epoch, on the scale described in :mod:`bench.cases`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

import ortflow

from .cases import Case, CaseData, fresh_sklearn, initial_layers


class Skip(Exception):
    """The engine cannot run here (missing package or feature); the message says why."""


@dataclass
class Run:
    setup_s: float
    epoch_times: list[float]
    losses: list[float]
    info: dict = field(default_factory=dict)


def available(name: str, case: Case) -> str | None:
    """None when the engine can run ``case``, else the reason it is skipped."""
    if name in ("torch", "ortflow-torch"):
        try:
            importlib.import_module("torch")
        except ImportError:
            return "torch is not installed (pip install 'ortflow[bench]')"
    if name == "raw" and ortflow.backend() != "training":
        return "the raw loop is onnxruntime-training's on-device training API (plain onnxruntime installed)"
    if name in ("raw", "ortflow-full") and case.momentum > 0:
        return "the on-device training API has no momentum SGD"
    if name == "ortflow-torch" and case.task != "regression":
        return "the torch-layer engine trains regression cases (MSELoss on the graph's single output)"
    if name == "sklearn-sgd" and (case.task != "regression" or case.hidden):
        return "SGDRegressor is a linear regressor"
    return None


@contextlib.contextmanager
def quiet_ort_info():
    """Drop onnxruntime's INFO lines from stderr (file descriptor 2), keep everything else.

    Once a first session exists, every ``generate_artifacts`` prints ~20 ``[I:onnxruntime ...] GraphTransformer``
    lines per graph from the gradient builder; ``ort.set_default_logger_severity`` does not silence them.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().decode(errors="replace").splitlines(True)
                    if "[I:onnxruntime" not in ln and "MergeShapeInfo" not in ln]
            if kept:
                sys.stderr.write("".join(kept))


def train(name: str, case: Case, data: CaseData, epochs: int, threads: int, **options) -> Run:
    func = {
        "raw": train_raw,
        "ortflow-full": train_ortflow_full,
        "ortflow-fwbw": train_ortflow_fwbw,
        "sklearn": train_sklearn,
        "sklearn-sgd": train_sklearn_sgd,
        "torch": train_torch,
        "ortflow-torch": train_ortflow_torch,
    }[name]
    with quiet_ort_info():
        return func(case, data, epochs, threads, **options)


# --- ONNX graphs -------------------------------------------------------------------------------------------------
def prediction_graph(data: CaseData):
    return ortflow.to_onnx(data.init_model)


def loss_graph(case: Case, data: CaseData):
    score = "squared_error" if case.task == "regression" else "log"
    return ortflow.add_loss_output(prediction_graph(data), score_name=score)


def session_options(threads: int, settings: dict | None = None):
    """SessionOptions with ``threads`` intra-op threads and optional settings (see bench.ort_options)."""
    from ortflow._ort import ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = int(threads)
    for key, value in (settings or {}).items():
        if key == "graph_optimization_level":
            options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, value)
        elif key == "execution_mode":
            options.execution_mode = getattr(ort.ExecutionMode, value)
        elif key in ("enable_mem_pattern", "enable_cpu_mem_arena", "enable_mem_reuse"):
            setattr(options, key, bool(value))
        elif key == "inter_op_num_threads":
            options.inter_op_num_threads = int(value)
        else:  # session configuration entries, e.g. session.intra_op.allow_spinning
            options.add_session_config_entry(key, str(value))
    return options


# --- raw onnxruntime loop ------------------------------------------------------------------------------------------
def train_raw(case: Case, data: CaseData, epochs: int, threads: int, settings: dict | None = None,
              capi: bool = False) -> Run:
    """The floor: ``generate_artifacts`` then, per batch, ``module(X, y)``, ``optimizer.step()``,
    ``module.lazy_reset_grad()``. With ``capi=True`` the pybind objects behind Module/Optimizer are called
    directly (what a trainer can do to skip the Python wrappers)."""
    from ortflow._ort import OrtValueVector, api, artifacts
    from ortflow.graph.editing import keep_outputs, relu_as_mask, trainable_initializers

    begin = time.perf_counter()
    settings = dict(settings or {})
    model = keep_outputs(loss_graph(case, data), ["loss"])
    if settings.pop("relu_as_mask", False):  # the graph ortflow's trainers train on CPU
        model = relu_as_mask(model)
    with tempfile.TemporaryDirectory(prefix="bench-raw-") as folder:
        artifacts.generate_artifacts(
            model,
            requires_grad=trainable_initializers(model),
            frozen_params=[],
            loss=None,
            optimizer=artifacts.OptimType.SGD,
            artifact_directory=folder,
        )
        state = api.CheckpointState.load_checkpoint(os.path.join(folder, "checkpoint"))
        module = api.Module(
            os.path.join(folder, "training_model.onnx"),
            state,
            os.path.join(folder, "eval_model.onnx"),
            "cpu",
            session_options(threads, settings),
        )
        optimizer = api.Optimizer(os.path.join(folder, "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(case.learning_rate)
    module.train()
    X, y, bs = data.X, data.loss_targets, case.batch_size
    n = len(X)
    setup = time.perf_counter() - begin
    times, losses = [], []
    if capi:
        cmod, copt = module._model, optimizer._optimizer
    for _ in range(epochs):
        t0 = time.perf_counter()
        total = 0.0
        if capi:
            for start in range(0, n, bs):
                fetches = OrtValueVector()  # no clear() in 1.19.2
                cmod.train_step([X[start : start + bs], y[start : start + bs]], fetches)
                total += float(fetches[0].numpy()) * min(bs, n - start)
                copt.optimizer_step()
                cmod.lazy_reset_grad()
        else:
            for start in range(0, n, bs):
                loss = module(X[start : start + bs], y[start : start + bs])
                optimizer.step()
                module.lazy_reset_grad()
                total += float(loss) * min(bs, n - start)
        times.append(time.perf_counter() - t0)
        losses.append(total / n)
    del module, optimizer, state
    return Run(setup, times, losses)


# --- ortflow -------------------------------------------------------------------------------------------------------
def epoch_clock():
    """A callback stamping the end of every epoch: the trainer's own ``history_[i]['time']`` stops before its
    per-epoch bookkeeping and callbacks, the bench times the whole loop like it does for the other engines.
    Put it last in the list."""
    from ortflow.trainers.callbacks import Callback

    class EpochClock(Callback):
        def on_train_begin(self, trainer):
            self.stamps = [(time.perf_counter(), time.process_time())]

        def on_epoch_end(self, trainer, record):
            self.stamps.append((time.perf_counter(), time.process_time()))

        @property
        def epoch_times(self):
            return list(np.diff([wall for wall, _ in self.stamps]))

        @property
        def epoch_cpu_times(self):
            """The process's CPU seconds of every epoch (all its threads)."""
            return list(np.diff([cpu for _, cpu in self.stamps]))

    return EpochClock()


def train_ortflow_full(case: Case, data: CaseData, epochs: int, threads: int, callbacks=None) -> Run:
    begin = time.perf_counter()
    clock = epoch_clock()
    callbacks = list(callbacks or []) + [clock]
    trainer = ortflow.OrtGradientOptimizer(
        loss_graph(case, data),
        max_iter=epochs,
        batch_size=case.batch_size,
        learning_rate=case.learning_rate,
        lr_schedule="constant",
        shuffle=False,
        n_threads=threads,
        callbacks=callbacks,
    )
    trainer.fit(data.X, data.y)
    total = time.perf_counter() - begin
    return _from_history(trainer, total, clock)


def _fwbw_learning_rate(case: Case):
    if case.momentum > 0:
        return ortflow.LearningRateSGDNesterov(eta0=case.learning_rate, momentum=case.momentum, nesterov=True,
                                               learning_rate="constant")
    return ortflow.LearningRateSGD(eta0=case.learning_rate, learning_rate="constant")


def train_ortflow_fwbw(case: Case, data: CaseData, epochs: int, threads: int, callbacks=None) -> Run:
    begin = time.perf_counter()
    clock = epoch_clock()
    trainer = ortflow.OrtGradientForwardBackwardOptimizer(
        prediction_graph(data),
        max_iter=epochs,
        batch_size=case.batch_size,
        learning_rate=_fwbw_learning_rate(case),
        learning_loss="square_error" if case.task == "regression" else "neg_log",
        shuffle=False,
        n_threads=threads,
        callbacks=list(callbacks or []) + [clock],
    )
    trainer.fit(data.X, data.y)
    total = time.perf_counter() - begin
    return _from_history(trainer, total, clock)


def _from_history(trainer, total: float, clock) -> Run:
    times = [float(t) for t in clock.epoch_times]
    losses = [float(v) for v in trainer.train_losses_]
    own = [float(r["time"]) for r in trainer.history_]
    return Run(total - sum(times), times, losses, {"history_time_share": sum(own) / max(sum(times), 1e-12),
                                                   "n_threads": trainer.n_threads_})


# --- scikit-learn --------------------------------------------------------------------------------------------------
def train_sklearn(case: Case, data: CaseData, epochs: int, threads: int) -> Run:
    from threadpoolctl import threadpool_limits

    begin = time.perf_counter()
    model = fresh_sklearn(data)
    X = data.X
    y = data.y.ravel() if case.task == "regression" else data.y.ravel().astype(np.int64)
    scale = 2.0 if case.task == "regression" else 1.0  # sklearn's squared loss is halved
    setup = time.perf_counter() - begin
    times, losses = [], []
    with threadpool_limits(threads):
        for _ in range(epochs):
            t0 = time.perf_counter()
            model.partial_fit(X, y)
            times.append(time.perf_counter() - t0)
            losses.append(float(model.loss_) * scale)
    return Run(setup, times, losses)


def train_sklearn_sgd(case: Case, data: CaseData, epochs: int, threads: int) -> Run:
    from sklearn.linear_model import SGDRegressor

    begin = time.perf_counter()
    (coef, intercept), = initial_layers(data)
    model = SGDRegressor(loss="squared_error", penalty=None, alpha=0.0, learning_rate="constant",
                         eta0=case.learning_rate, shuffle=False, average=False)
    X, y = data.X.astype(np.float64), data.y.ravel().astype(np.float64)
    model.partial_fit(X[:1], y[:1])  # allocates coef_; then reset to the shared start
    model.coef_ = coef.ravel().astype(np.float64).copy()
    model.intercept_ = intercept.astype(np.float64).copy()
    setup = time.perf_counter() - begin
    times, losses = [], []
    for _ in range(epochs):
        t0 = time.perf_counter()
        model.partial_fit(X, y)
        times.append(time.perf_counter() - t0)
        losses.append(float(np.mean((model.predict(X) - y) ** 2)))  # after the epoch: not the same quantity
    return Run(setup, times, losses, {"loss_note": "MSE after each epoch (per-row updates)"})


# --- PyTorch -------------------------------------------------------------------------------------------------------
def train_torch(case: Case, data: CaseData, epochs: int, threads: int) -> Run:
    """The model as ``nn.Sequential`` (Linear + ReLU), trained by :func:`torch_loop`."""
    try:
        import torch
    except ImportError as exc:
        raise Skip("torch is not installed") from exc

    begin = time.perf_counter()
    torch.set_num_threads(threads)
    return torch_loop(torch_sequential(case, data), case, data, epochs, begin)


def torch_sequential(case: Case, data: CaseData):
    """The case's model as ``nn.Sequential`` (Linear + ReLU) with the initial weights."""
    import torch

    layers = []
    for i, (coef, intercept) in enumerate(initial_layers(data)):
        lin = torch.nn.Linear(coef.shape[0], coef.shape[1])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(coef.T)))
            lin.bias.copy_(torch.from_numpy(intercept))
        layers.append(lin)
        if i < len(case.hidden):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def train_ortflow_torch(case: Case, data: CaseData, epochs: int, threads: int) -> Run:
    """The model's ONNX graph as one :class:`ortflow.torch.OnnxModule` layer, trained by :func:`torch_loop`
    (onnxruntime runs the forward and backward passes, torch the loss and SGD, with ``threads`` set as torch's
    count, which the layer follows by default: one onnxruntime thread for a batch too small to split)."""
    try:
        import torch

        from ortflow.torch import OnnxModule
    except ImportError as exc:
        raise Skip("torch is not installed") from exc

    begin = time.perf_counter()
    torch.set_num_threads(threads)
    return torch_loop(OnnxModule(prediction_graph(data)), case, data, epochs, begin)


def torch_loop(model, case: Case, data: CaseData, epochs: int, begin: float) -> Run:
    """Per batch: ``zero_grad``, loss, ``backward``, ``torch.optim.SGD.step``; the set-up time runs from
    ``begin`` to the first epoch."""
    import torch

    X, y = torch.from_numpy(data.X), torch.from_numpy(data.y)
    if case.task == "regression":
        loss_fn = torch.nn.MSELoss()
    elif data.loss_targets is data.y:
        loss_fn = torch.nn.BCEWithLogitsLoss()
    else:  # k classes: softmax cross-entropy on the k raw scores, labels as class indices
        loss_fn = torch.nn.CrossEntropyLoss()
        y = torch.from_numpy(np.searchsorted(data.init_model.classes_, data.y.ravel()).astype(np.int64))
    opt = torch.optim.SGD(model.parameters(), lr=case.learning_rate, momentum=case.momentum,
                          nesterov=case.momentum > 0)
    n, bs = len(data.X), case.batch_size
    setup = time.perf_counter() - begin
    times, losses = [], []
    for _ in range(epochs):
        t0 = time.perf_counter()
        total = 0.0
        for start in range(0, n, bs):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(X[start : start + bs]), y[start : start + bs])
            loss.backward()
            opt.step()
            total += loss.item() * min(bs, n - start)
        times.append(time.perf_counter() - t0)
        losses.append(total / n)
    return Run(setup, times, losses, {"torch_threads": torch.get_num_threads()})
