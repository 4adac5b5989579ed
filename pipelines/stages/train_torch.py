"""``trainer=torch``: the converted prediction graph trained as an :class:`ortflow.torch.OnnxModule` by a torch
optimizer (``sgd``, ``nesterov``, ``adam``, ``adamw``) and LR scheduler (``constant``, or ``invscaling``:
``learning_rate / epoch ** power_t``, stepped once per epoch).

:class:`TorchTrainer` has the surface the train stage uses from ortflow's trainers: ``fit``, ``history_`` (one
record per epoch: ``epoch``, ``train_loss``, ``validation_loss``, ``learning_rate``, ``time``), ortflow callbacks,
``get_state``/``set_state`` (early stopping), ``save_onnx_graph``. Classifiers train on their ``raw_score``
output with the log loss (binary: sigmoid; k classes: softmax cross-entropy), their labels mapped through the
classes the graph carries as the other trainers do; the trained weights then go back into the whole classifier
graph.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence

import numpy as np
import onnx
from omegaconf import DictConfig

import ortflow
from ortflow import graph as g

from ..base.config import ConfigError
from ..modeling.estimators import penalty_spec

LOSSES = ("square", "absolute", "elastic", "log")
OPTIMIZERS = ("sgd", "nesterov", "adam", "adamw")
SCORE_OUTPUT = "raw_score"  # the classifier output before the sigmoid (ortflow.convert)


class TorchTrainer:
    """Train ``graph`` (a prediction graph) through an ``OnnxModule`` with a torch optimizer and scheduler."""

    def __init__(self, graph: onnx.ModelProto, optimizer: str = "sgd", learning_rate: float = 0.01,
                 momentum: float = 0.9, lr_schedule: str = "constant", power_t: float = 0.25, loss: str = "square",
                 l1_weight: float = 0.5, l2_weight: float = 0.5, max_iter: int = 20, batch_size: int = 32,
                 shuffle: bool = True, random_state: int = 0, early_stopping: bool = False,
                 n_iter_no_change: int = 10, tol: float = 1e-4, weights_to_train: Sequence[str] | None = None,
                 penalty: tuple[float, float, Sequence[str]] | None = None, callbacks: Sequence[ortflow.Callback] = (),
                 n_threads: int | None = None):
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={optimizer!r}: trainer=torch offers {list(OPTIMIZERS)}")
        if loss not in LOSSES:
            raise ValueError(f"loss={loss!r}: trainer=torch offers {list(LOSSES)}")
        if lr_schedule not in ("constant", "invscaling"):
            raise ValueError(f"lr_schedule={lr_schedule!r}: use 'constant' or 'invscaling'")
        self.graph = graph
        self.optimizer, self.learning_rate, self.momentum = optimizer, learning_rate, momentum
        self.lr_schedule, self.power_t = lr_schedule, power_t
        self.loss, self.l1_weight, self.l2_weight = loss, l1_weight, l2_weight
        self.max_iter, self.batch_size, self.shuffle, self.random_state = max_iter, batch_size, shuffle, random_state
        self.early_stopping, self.n_iter_no_change, self.tol = early_stopping, n_iter_no_change, tol
        self.weights_to_train = weights_to_train
        self.penalty = penalty
        self.callbacks = list(callbacks)
        self.n_threads = n_threads  # onnxruntime intra-op threads (None: torch.get_num_threads())

    # --- torch pieces ---
    def _make_optimizer(self, params):
        import torch

        if self.optimizer in ("sgd", "nesterov"):
            nesterov = self.optimizer == "nesterov"
            return torch.optim.SGD(params, lr=self.learning_rate, momentum=self.momentum if nesterov else 0.0,
                                   nesterov=nesterov)
        cls = torch.optim.Adam if self.optimizer == "adam" else torch.optim.AdamW
        return cls(params, lr=self.learning_rate)

    def _make_scheduler(self, optimizer):
        import torch

        power = self.power_t if self.lr_schedule == "invscaling" else 0.0
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 1.0 / (epoch + 1) ** power)

    def _loss(self, score, y):
        import torch.nn.functional as F

        if self.loss == "square":
            return F.mse_loss(score, y)
        if self.loss == "absolute":
            return F.l1_loss(score, y)
        if self.loss == "elastic":
            return self.l1_weight * F.l1_loss(score, y) + self.l2_weight * F.mse_loss(score, y)
        if score.shape[-1] > 1:  # k raw scores, one-hot targets
            return F.cross_entropy(score, y)
        return F.binary_cross_entropy_with_logits(score, y)

    def _target(self, y: np.ndarray, n_outputs: int):
        import torch

        from ortflow.convert import graph_classes
        from ortflow.validation import encode_labels

        y = np.asarray(y)
        classes = graph_classes(self.graph) if self.loss == "log" else None
        if classes is not None:  # labels as the data has them -> indicator (binary) or one-hot rows
            y = encode_labels(y, classes, n_outputs)
        elif self.loss == "log":
            labels = set(np.unique(y).tolist())
            if not labels <= {0, 1}:
                raise ValueError(f"loss=log with trainer=torch needs labels 0/1, got {sorted(labels)[:5]}")
        return torch.tensor(y.reshape(len(y), n_outputs), dtype=torch.float32)

    # --- estimator surface ---
    def fit(self, X, y, validation_data=None, resume_from=None) -> TorchTrainer:
        """Train for ``max_iter`` epochs (fewer with early stopping); ``resume_from`` is not supported."""
        import torch

        from ortflow.torch import OnnxModule

        if resume_from is not None:
            raise ValueError("trainer=torch cannot resume from a checkpoint (trainer.resume_from)")
        outputs = g.output_names(self.graph)
        self.score_output_ = SCORE_OUTPUT if SCORE_OUTPUT in outputs else outputs[0]
        self.trained_graph_ = g.keep_outputs(self.graph, [self.score_output_])
        torch.manual_seed(self.random_state)
        self.module_ = OnnxModule(self.trained_graph_, weights_to_train=self.weights_to_train,
                                  n_threads=self.n_threads)
        n_outputs = g.shape_of(self.trained_graph_, self.score_output_)[-1]
        n_outputs = n_outputs if isinstance(n_outputs, int) else 1
        X = torch.tensor(np.asarray(X), dtype=torch.float32)
        target = self._target(y, n_outputs)
        valid = None
        if validation_data is not None:
            valid = (torch.tensor(np.asarray(validation_data[0]), dtype=torch.float32),
                     self._target(validation_data[1], n_outputs))
        optimizer = self._make_optimizer(self.module_.parameters())
        scheduler = self._make_scheduler(optimizer)
        callbacks = list(self.callbacks)
        if self.early_stopping:
            callbacks.insert(0, ortflow.EarlyStopping(patience=self.n_iter_no_change, tol=self.tol))
        rng = np.random.default_rng(self.random_state)
        self.history_, self.stop_training_ = [], False
        for callback in callbacks:
            callback.on_train_begin(self)
        try:
            for epoch in range(1, self.max_iter + 1):
                begin = time.perf_counter()
                rate = optimizer.param_groups[0]["lr"]
                train_loss = self._epoch(X, target, optimizer, rng)
                scheduler.step()
                record = {"epoch": epoch, "train_loss": train_loss, "validation_loss": self._evaluate(valid),
                          "learning_rate": rate, "time": time.perf_counter() - begin}
                self.history_.append(record)
                if not math.isfinite(train_loss):
                    raise ortflow.ConvergenceError(f"trainer=torch: the training loss is {train_loss} at epoch "
                                                   f"{epoch}; lower trainer.learning_rate")
                for callback in callbacks:
                    callback.on_epoch_end(self, record)
                if self.stop_training_:
                    break
        finally:
            for callback in callbacks:
                callback.on_train_end(self)
        return self

    def _epoch(self, X, target, optimizer, rng) -> float:
        import torch

        self.module_.train()
        order = torch.from_numpy(rng.permutation(len(X))) if self.shuffle else None
        total = 0.0
        for start in range(0, len(X), self.batch_size):
            rows = slice(start, start + self.batch_size) if order is None else order[start:start + self.batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = self._loss(self.module_(X[rows]), target[rows])
            (loss + self._penalty()).backward()
            optimizer.step()
            value = loss.item()
            total += value * len(target[rows])
            if not math.isfinite(value):
                return value
        return total / len(X)

    def _penalty(self):
        """``l1 * sum |w| + l2 * sum w**2`` over the penalized weights (0 without penalty); not in the reported
        losses, as with the other trainers."""
        if not self.penalty:
            return 0.0
        l1, l2, names = self.penalty
        params = self.module_.parameters_by_initializer()
        return sum(l1 * params[n].abs().sum() + l2 * params[n].square().sum() for n in names if n in params)

    def _evaluate(self, valid) -> float | None:
        import torch

        if valid is None:
            return None
        self.module_.eval()
        with torch.no_grad():
            return float(self._loss(self.module_(valid[0]), valid[1]))

    @property
    def train_losses_(self) -> list[float]:
        return [r["train_loss"] for r in self.history_]

    @property
    def validation_losses_(self) -> list[float]:
        return [r["validation_loss"] for r in self.history_ if r["validation_loss"] is not None]

    @property
    def n_iter_(self) -> int:
        return len(self.history_)

    def get_state(self) -> dict[str, np.ndarray]:
        """The trained weights (copies), by initializer name."""
        return {name: p.detach().numpy().copy() for name, p in self.module_.parameters_by_initializer().items()}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        import torch

        with torch.no_grad():
            for name, param in self.module_.parameters_by_initializer().items():
                param.copy_(torch.from_numpy(np.asarray(state[name])))

    def trained_model(self) -> onnx.ModelProto:
        """The whole prediction graph (every output) with the trained weights."""
        return g.replace_initializers(self.graph, self.get_state())

    def save_onnx_graph(self, folder: str | os.PathLike) -> dict[str, str]:
        """Write the trained prediction graph, the graph torch trained and onnxruntime's forward-backward graphs
        into ``folder``; return name -> path."""
        os.makedirs(folder, exist_ok=True)
        graphs = {"trained_model": self.trained_model(), "model": self.module_.get_trained_onnx(),
                  **self.module_.training_graphs()}
        paths = {}
        for name, model in graphs.items():
            path = g.safe_join(folder, f"{name}.onnx")
            onnx.save(model, str(path))
            paths[name] = str(path)
        return paths


def build_torch(cfg: DictConfig, graph: onnx.ModelProto, callbacks: list) -> TorchTrainer:
    """The trainer of ``trainer=torch`` for the prediction graph ``graph``."""
    t = cfg.trainer
    if int(t.checkpoint_every) > 0 or t.resume_from:
        raise ConfigError("trainer=torch does not write or read checkpoints: drop trainer.checkpoint_every and "
                          "trainer.resume_from, or use trainer=full / fwbw")
    if str(t.device) != "cpu":
        raise ConfigError(f"trainer.device={t.device}: trainer=torch runs on cpu here (the cpu onnxruntime build)")
    loss = str(cfg.loss.name)
    spec = penalty_spec(cfg, graph)  # the weights the other trainers penalize (default: every coef_*)
    penalty = (float(cfg.penalty.l1), float(cfg.penalty.l2), list(spec)) if spec else None
    return TorchTrainer(
        graph, optimizer=str(t.optimizer), learning_rate=float(t.learning_rate), momentum=float(t.momentum),
        lr_schedule=str(t.lr_schedule), power_t=float(t.power_t), loss=loss,
        l1_weight=float(cfg.loss.get("l1_weight", 0.5)), l2_weight=float(cfg.loss.get("l2_weight", 0.5)),
        max_iter=int(t.max_iter), batch_size=int(t.batch_size), shuffle=bool(t.shuffle), random_state=int(t.seed),
        early_stopping=bool(t.early_stopping), n_iter_no_change=int(t.n_iter_no_change), tol=float(t.tol),
        weights_to_train=list(t.weights_to_train) if t.weights_to_train else None, penalty=penalty,
        callbacks=callbacks, n_threads=None if t.n_threads is None else int(t.n_threads),
    )
