"""Small objects that extend a trainer's epoch loop (skorch-style callbacks).

A callback receives the trainer and, after each epoch, that epoch's record: a dict with ``epoch`` (1-based),
``train_loss``, ``validation_loss`` (None when not measured), ``learning_rate`` and ``time`` (seconds).
Setting ``trainer.stop_training_ = True`` ends training after the current epoch. During a streamed fit
(``fit(source)``) it is also called after each chunk of an epoch (``on_chunk_end``), with the position in it.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any


class Callback:
    """Base class: override the hooks you need."""

    def on_train_begin(self, trainer: Any) -> None:
        """Called once before the first epoch (and after a checkpoint was restored)."""

    def on_chunk_end(self, trainer: Any, position: Any) -> None:
        """Called during a streamed fit after each chunk of an epoch is trained (the units of whole batches the
        source's rows are cut into), with an :class:`ortflow.trainers.checkpoint.StreamPosition` (``epoch``, ``chunks``,
        ``rows``); the weights are then at a chunk boundary, where ``trainer.save_checkpoint`` may write a
        mid-epoch checkpoint. Not called by an in-memory fit, whose epochs are its only boundaries."""

    def on_epoch_end(self, trainer: Any, record: dict) -> None:
        """Called after every epoch with its record."""

    def on_train_end(self, trainer: Any) -> None:
        """Called once after the last epoch, also when training stopped early or diverged."""


class EarlyStopping(Callback):
    """Stop when ``monitor`` has not improved by ``tol`` for ``patience`` epochs; restore the best weights."""

    def __init__(self, monitor: str = "validation_loss", patience: int = 10, tol: float = 1e-4,
                 restore_best: bool = True):
        self.monitor = monitor
        self.patience = patience
        self.tol = tol
        self.restore_best = restore_best

    def on_train_begin(self, trainer: Any) -> None:
        self.best_ = math.inf
        self.best_epoch_ = 0
        self.best_state_ = None
        self._stale = 0

    def on_epoch_end(self, trainer: Any, record: dict) -> None:
        value = record.get(self.monitor)
        if value is None:
            if self.monitor == "validation_loss":
                value = record["train_loss"]
            else:
                raise KeyError(f"EarlyStopping monitors {self.monitor!r}, which the epoch record does not have")
        if value < self.best_ - self.tol:
            self.best_, self.best_epoch_, self._stale = value, record["epoch"], 0
            if self.restore_best:
                self.best_state_ = trainer.get_state()
        else:
            self._stale += 1
            if self._stale >= self.patience:
                trainer.stop_training_ = True

    def on_train_end(self, trainer: Any) -> None:
        if self.restore_best and self.best_state_ is not None and trainer.stop_training_:
            trainer.set_state(self.best_state_)


class Checkpoint(Callback):
    """Write ``trainer.save_checkpoint(folder)`` every ``every`` epochs (and after the last one) and, during a
    streamed fit, after every ``every_rows`` rows of an epoch.

    The folder is replaced at each write (the last checkpoint wins). Subclasses can override
    :meth:`on_checkpoint`, called after each write, to copy or upload it; ``saved_epoch_`` is the epoch of
    the last write (None before the first; the completed epochs of a mid-epoch checkpoint).

    ``every_rows`` (None: epoch boundaries only) counts rows, not chunks: the chunks a stream is cut into depend
    on the source's buffer and the batch size, the rows do not. The checkpoint is written at the first chunk
    boundary after ``every_rows`` rows were trained since the last one of the epoch (or its start): a chunk is
    never split, so with chunks larger than ``every_rows`` each chunk gets one. ``fit(source, resume_from=folder)``
    continues from that position: the epoch's order is replayed from the random state at its start, the rows
    already trained are read and skipped, and the run ends with the weights of an uninterrupted one.
    """

    def __init__(self, folder: str | Path, every: int = 1, every_rows: int | None = None):
        self.folder = folder
        self.every = every
        if every_rows is not None and (isinstance(every_rows, bool) or int(every_rows) != every_rows
                                       or every_rows < 1):
            raise ValueError(f"every_rows={every_rows!r} must be a positive integer or None")
        self.every_rows = every_rows

    def on_train_begin(self, trainer: Any) -> None:
        self.saved_epoch_ = None
        self._rows_saved = None  # (epoch, rows) of the last mid-epoch write

    def on_chunk_end(self, trainer: Any, position: Any) -> None:
        if self.every_rows is None:
            return
        last = self._rows_saved[1] if self._rows_saved and self._rows_saved[0] == position.epoch else 0
        if position.rows - last >= self.every_rows:
            self._save(trainer)
            self._rows_saved = (position.epoch, position.rows)

    def on_epoch_end(self, trainer: Any, record: dict) -> None:
        if record["epoch"] % self.every == 0:
            self._save(trainer)

    def on_train_end(self, trainer: Any) -> None:
        # the last epoch's checkpoint, unless on_epoch_end just wrote it, training diverged, or it was interrupted
        # mid-epoch (the weights are then not those of a chunk or epoch boundary: the last checkpoint written stays)
        if getattr(trainer, "diverged_", False) or getattr(trainer, "in_epoch_", False):
            return
        if getattr(self, "saved_epoch_", None) != len(trainer.history_):
            self._save(trainer)

    def on_checkpoint(self, trainer: Any, folder: str, epoch: int) -> None:
        """Called after each checkpoint is written to ``folder`` (``epoch``: the completed epochs it holds)."""

    def _save(self, trainer: Any) -> None:
        folder = trainer.save_checkpoint(self.folder)
        self.saved_epoch_ = len(trainer.history_)
        self.on_checkpoint(trainer, folder, self.saved_epoch_)


class ProgressBar(Callback):
    """A tqdm bar over epochs showing the losses (a plain line per epoch when tqdm is missing)."""

    def __init__(self, stream=None):
        self.stream = stream

    def on_train_begin(self, trainer: Any) -> None:
        try:
            from tqdm.auto import tqdm
        except ImportError:  # pragma: no cover - tqdm is optional
            self._bar = None
            return
        done = len(getattr(trainer, "history_", []))
        self._bar = tqdm(total=trainer.max_iter, initial=done, unit="epoch", file=self.stream or sys.stderr,
                         desc=type(trainer).__name__)

    def on_epoch_end(self, trainer: Any, record: dict) -> None:
        text = {"loss": f"{record['train_loss']:.4g}"}
        if record.get("validation_loss") is not None:
            text["val"] = f"{record['validation_loss']:.4g}"
        if self._bar is None:
            print(f"epoch {record['epoch']}: {text}", file=self.stream or sys.stderr)
        else:
            self._bar.set_postfix(text, refresh=False)
            self._bar.update(1)

    def on_train_end(self, trainer: Any) -> None:
        if self._bar is not None:
            self._bar.close()
