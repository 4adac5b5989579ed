"""The epoch metrics of training: :class:`MlflowMetricsCallback` buffers them and writes them in the background;
:func:`resend` sends what it spooled while the store was away."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric

from ortflow.trainers.callbacks import Callback

from .records import is_finite
from .retries import RetryingClient
from .runs import FAILURE_TAG
from .store import Tracking, check_reachable

_log = logging.getLogger("pipelines.tracking")


class MlflowMetricsCallback(Callback):
    """Sends each epoch's record (train/validation loss, learning rate, epoch time) to a run, with step=epoch.

    Records are kept in memory (the epoch loop pays for one list append) and handed to MLflow's asynchronous
    logging in one ``log_batch`` every ``flush_seconds`` seconds (long runs stay live in the UI), every
    ``flush_every`` epochs when that is > 0, and at the end of training; a background thread writes.
    :meth:`wait` blocks until everything is stored (a batch that failed is written again synchronously, with
    retries): call it after other work so the last write overlaps that work.
    ``overhead_seconds`` is the time spent in this callback plus in :meth:`wait`. The learning rate is logged
    at the first epoch and whenever it changes. A training resumed from a checkpoint logs the epochs the
    checkpoint holds first (its ``history_`` when training begins), so the run holds the whole curve.
    """

    KEYS = {"train_loss": "train_loss", "validation_loss": "validation_loss", "time": "epoch_time_seconds"}

    def __init__(self, tracking: Tracking, run_id: str, flush_every: int = 0, flush_seconds: float = 10.0,
                 synchronous: bool = False):
        self.tracking = tracking
        self.run_id = run_id
        self.flush_every = flush_every
        self.flush_seconds = flush_seconds
        self.synchronous = synchronous
        self.overhead_seconds = 0.0
        self.loop_seconds = 0.0  # the part spent inside the epoch loop (on_epoch_end)
        self.flushes = 0
        self._records: list[tuple[int, dict]] = []
        self._pending: list[tuple[Any, list[Metric]]] = []
        self._last_flush = time.perf_counter()
        self._last_lr: float | None = None

    def on_train_begin(self, trainer: Any) -> None:
        # resumed from a checkpoint: its epochs go to this run too, so the whole curve is in one run (steps 1..N)
        now = int(time.time() * 1000)
        self._records.extend((now, record) for record in getattr(trainer, "history_", None) or ())
        self._last_flush = time.perf_counter()

    def on_epoch_end(self, trainer: Any, record: dict) -> None:
        start = time.perf_counter()
        self._records.append((int(time.time() * 1000), record))
        if (self.flush_every and len(self._records) >= self.flush_every) or (
                start - self._last_flush >= self.flush_seconds):
            self.flush()
        elapsed = time.perf_counter() - start
        self.loop_seconds += elapsed
        self.overhead_seconds += elapsed

    def on_train_end(self, trainer: Any) -> None:
        start = time.perf_counter()
        self.flush()  # queued: call wait() once the caller has done its own work
        self.overhead_seconds += time.perf_counter() - start

    def _metrics(self) -> list[Metric]:
        metrics = []
        for now, record in self._records:
            step = int(record["epoch"])
            for key, name in self.KEYS.items():
                value = record.get(key)
                if value is not None and is_finite(value):
                    metrics.append(Metric(name, float(value), now, step))
            lr = record.get("learning_rate")
            if lr is not None and lr != self._last_lr and is_finite(lr):
                metrics.append(Metric("learning_rate", float(lr), now, step))
                self._last_lr = lr
        self._records = []
        return metrics

    def flush(self) -> None:
        """Queue (or write, when synchronous) the buffered epochs. Never raises: a batch the store refused stays
        pending, for :meth:`wait` to write again (training goes on while a tracking server is down)."""
        metrics = self._metrics()
        for begin in range(0, len(metrics), 1000):
            chunk = metrics[begin:begin + 1000]
            operation = None
            try:
                operation = self.tracking.client._client.log_batch(
                    self.run_id, metrics=chunk, synchronous=self.synchronous)
                if self.synchronous:
                    continue
            except Exception as exc:  # noqa: BLE001 - kept pending, written again by wait()
                _log.warning("epoch metrics not stored yet (%s); kept for a later write", str(exc).splitlines()[0])
            self._pending.append((operation, chunk))
            self.flushes += 1
        self._last_flush = time.perf_counter()

    def wait(self) -> None:
        """Block until every epoch metric is stored; batches whose write failed are written again with the
        store's retries. Raises when the store stays away; :meth:`spool` then saves what was not stored."""
        start = time.perf_counter()
        try:
            self.flush()
            while self._pending:
                operation, chunk = self._pending[0]
                try:
                    if operation is None:
                        raise RuntimeError("not written yet")
                    operation.wait()
                except Exception:  # noqa: BLE001 - written again, with retries
                    self.tracking.client.log_batch(self.run_id, metrics=chunk)
                self._pending.pop(0)
        finally:
            self.overhead_seconds += time.perf_counter() - start

    def spool(self, path: str | Path, reason: str) -> int:
        """Write the epoch metrics not known to be stored, and why, to ``path`` (JSON, see :func:`resend`)."""
        metrics = [m for _, chunk in self._pending for m in chunk] + self._metrics()
        self._pending = []
        Path(path).write_text(json.dumps({
            "tracking_uri": self.tracking.uri, "run_id": self.run_id, "failure_reason": reason,
            "metrics": [[m.key, m.value, m.timestamp, m.step] for m in metrics]}))
        return len(metrics)


def resend(path: str | Path, tracking_uri: str | None = None, connect_timeout: float = 5.0, retries: int = 8,
           retry_seconds: float = 60.0) -> int:
    """Send the metrics spooled by :meth:`MlflowMetricsCallback.spool` to their run, and end that run FAILED with
    the spooled reason if it is still RUNNING (its stage did not finish logging); returns the metric count.

    The stages' policy: the server must answer within ``connect_timeout`` (else :class:`TrackingUnavailableError`
    at once), and each call retries transient errors ``retries`` times within ``retry_seconds``."""
    spooled = json.loads(Path(path).read_text())
    uri = tracking_uri or spooled["tracking_uri"]
    check_reachable(uri, connect_timeout)
    client = RetryingClient(MlflowClient(tracking_uri=uri), retries=retries, retry_seconds=retry_seconds)
    run_id = spooled["run_id"]
    metrics = [Metric(key, float(value), int(timestamp), int(step)) for key, value, timestamp, step in
               spooled["metrics"]]
    for begin in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[begin:begin + 1000])
    if client.get_run(run_id).info.status == "RUNNING":
        client.set_tag(run_id, FAILURE_TAG, spooled["failure_reason"][:4900])
        client.set_terminated(run_id, "FAILED")
    return len(metrics)
