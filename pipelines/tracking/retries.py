"""Retries of tracking-store calls: transient errors ("database is locked" when parallel jobs write to one sqlite
file, a server that is down or busy) are retried with jittered exponential back-off (:func:`call`,
:class:`RetryingClient`), for at most ``mlflow.retries`` attempts within ``mlflow.retry_seconds``."""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Callable

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from ..base.interrupts import deferred, pending

_log = logging.getLogger("pipelines.tracking")
_TRANSIENT = ("database is locked", "database table is locked", "temporarily unavailable", "connection refused",
              "connection reset", "max retries exceeded")


def is_transient(exc: BaseException) -> bool:
    """Errors worth a retry: sqlite lock contention, a server that is briefly unavailable."""
    text = f"{type(exc).__name__}: {exc}".lower()
    if isinstance(exc, MlflowException) and "already exists" in text:
        return False
    return any(marker in text for marker in _TRANSIENT)


def call(fn: Callable, *args: Any, retries: int = 8, retry_seconds: float = 60.0, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, retried on transient store errors: ``retries`` times within ``retry_seconds``.

    Each attempt is a :func:`pipelines.base.interrupts.deferred` block: a signal ends the command after the
    attempt, never inside its transaction (whose lock the next attempts would wait on), and during a wait
    between attempts at once; while a signal waits for an enclosing block, no attempt is retried."""
    deadline = time.monotonic() + retry_seconds
    for attempt in range(retries + 1):
        try:
            with deferred():
                return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - filtered just below
            left = deadline - time.monotonic()
            if attempt >= retries or left <= 0 or not is_transient(exc) or pending():
                raise  # a signal waiting (inside a longer deferred block): no more waits
            delay = min(left, 5.0, 0.05 * 2**attempt * (0.5 + random.random()))
            _log.warning("MLflow store busy (%s), retry %d/%d in %.2f s", str(exc).splitlines()[0][:200],
                         attempt + 1, retries, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


class RetryingClient:
    """An ``MlflowClient`` whose methods retry transient errors (see :func:`call`)."""

    def __init__(self, client: MlflowClient, retries: int = 8, retry_seconds: float = 60.0):
        self._client = client
        self.retries = retries
        self.retry_seconds = retry_seconds

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def retrying(*args: Any, **kwargs: Any) -> Any:
            return call(attr, *args, retries=self.retries, retry_seconds=self.retry_seconds, **kwargs)

        return retrying
