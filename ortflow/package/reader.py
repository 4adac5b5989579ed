"""Reading a training package (:class:`TrainingPackage`: the manifest checked as a
:class:`~ortflow.package.format.Manifest`, every file against its checksum and size, every graph against the
manifest), a state trained from it (:class:`TrainingState`, :func:`load_training_state`) and the federated mean of
states (:func:`average_states`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx

from ..graph import editing as g
from ..exceptions import TrainingPackageError
from ..registry import family
from ..optimizers.schedules import learning_rate_at
from .format import (FORMAT_VERSION, MANIFEST, MAX_COUNT, PREDICT_FILE, STATE_FILE, STATE_FORMAT, Manifest,
                     StateEntry, StateHeader, StateTensor)
from .folder import sha256_bytes
from .graphs import check_graph
from .state import decode_tensors, encode_state, read_state, strict_json


class TrainingPackage:
    """A package folder, its manifest read and checked (:class:`~ortflow.package.format.Manifest`), every file's
    size and checksum verified and every graph compared with the manifest (:class:`TrainingPackageError` naming the
    file or the manifest's field otherwise). ``record`` is the manifest as records, ``manifest`` as JSON."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        path = self.folder / MANIFEST
        if not path.is_file():
            raise TrainingPackageError(f"{str(self.folder)!r} is not a training package: it has no {MANIFEST}")
        try:
            self.record = Manifest.from_json(strict_json(path.read_bytes(), repr(str(path))))
        except TrainingPackageError as exc:
            raise TrainingPackageError(f"{str(path)!r}: {exc}") from None
        self.manifest = self.record.to_json()
        self._files: dict[str, bytes] = {}
        for name, entry in self.record.files.items():
            file = g.safe_join(self.folder, name)
            if not file.is_file():
                raise TrainingPackageError(f"the package {str(self.folder)!r} lacks its file {name!r}")
            data = file.read_bytes()
            digest = sha256_bytes(data)
            if digest != entry.sha256:
                raise TrainingPackageError(f"{name!r} of the package {str(self.folder)!r} does not match its "
                                           f"checksum (sha256 {digest}, the manifest says {entry.sha256}): "
                                           "the file was changed or damaged")
            if len(data) != entry.bytes:
                raise TrainingPackageError(f"{str(path)!r}: files[{name!r}].bytes: {entry.bytes}, the file has "
                                           f"{len(data)} bytes")
            self._files[name] = data
        m = self.record
        try:
            for where, entry in [("step", m.step), ("step_flat", m.step_flat), ("predict", m.predict),
                                 *((f"unrolled[{i}]", u) for i, u in enumerate(m.unrolled))]:
                check_graph(entry.inputs, entry.outputs, self._files[entry.file], where)
        except TrainingPackageError as exc:
            raise TrainingPackageError(f"{str(path)!r}: {exc}") from None

    def read(self, name: str) -> bytes:
        """The verified bytes of the package's file ``name``."""
        return self._files[name]

    @property
    def id(self) -> str:
        return self.record.package_id

    @property
    def tensors(self) -> list[StateTensor]:
        """The state table: ``name, shape, offset (bytes), length (values)`` per tensor."""
        return self.record.state.tensors

    @property
    def weights(self) -> list[str]:
        return self.record.state.weights

    def initial_state(self) -> TrainingState:
        """The state the package starts from (``state.bin`` and the manifest's ``progress``)."""
        progress = self.record.progress
        tensors = decode_tensors(self.tensors, self.tensors, self.read(STATE_FILE), STATE_FILE)
        return TrainingState(self, tensors, progress.epochs, progress.steps, progress.rows_seen, 0)

    def learning_rate(self, rows_seen: int) -> float:
        """The schedule's rate for an epoch starting after ``rows_seen`` rows (what every runtime feeds, cast to
        float32)."""
        s = self.record.schedule
        return learning_rate_at(s.name, s.eta0, int(rows_seen), s.power_t, s.alpha)


@dataclass
class TrainingState:
    """A package's state: every state tensor (weights, then optimizer slots) and the progress that goes with it:
    ``epochs`` completed, optimizer ``steps``, ``rows_seen`` (all epochs), ``rows`` (the rows of the data of the
    last training, the weight of this state in :func:`average_states`)."""

    package: TrainingPackage
    tensors: dict[str, np.ndarray]
    epochs: int = 0
    steps: int = 0
    rows_seen: int = 0
    rows: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def weights(self) -> dict[str, np.ndarray]:
        """The trained weights (no optimizer slot)."""
        return {name: self.tensors[name] for name in self.package.weights}

    def get_trained_onnx(self) -> onnx.ModelProto:
        """The prediction graph with these weights inside, what any ONNX runtime runs."""
        return onnx.load_from_string(self.trained_onnx_bytes())

    def trained_onnx_bytes(self) -> bytes:
        """``predict.onnx`` with these weights written at the manifest's byte ranges (what the JavaScript library's
        ``exportModel()`` does; the ranges were checked to lie inside the file and hold their weight's bytes)."""
        data = bytearray(self.package.read(PREDICT_FILE))
        for patch in self.package.record.predict.weights:
            values = np.ascontiguousarray(self.tensors[patch.name], dtype="<f4").tobytes()
            if len(values) != patch.bytes:
                raise TrainingPackageError(f"the state's {patch.name!r} holds {len(values)} bytes, predict.onnx "
                                           f"takes {patch.bytes}")
            data[patch.offset: patch.offset + patch.bytes] = values
        return bytes(data)

    def to_bytes(self) -> bytes:
        """The state file (:mod:`ortflow.package.state`)."""
        header = StateHeader(STATE_FORMAT, FORMAT_VERSION, self.package.id,
                             [StateEntry(t.name, [], 0, 0) for t in self.package.tensors],
                             self.epochs, self.steps, self.rows_seen, self.rows, dict(self.extra))
        return encode_state(header, [self.tensors[t.name] for t in self.package.tensors])

    def estimator(self, **params):
        """An unfitted trainer of the package's loss graph holding these weights, its optimizer, schedule and batch
        size (``params`` overrides or adds settings: ``max_iter``...): ``from_state(state, **params)`` of the trainer
        class registered in :mod:`ortflow.registry`'s family ``"trainer"`` under the manifest's ``trainer`` name (a
        package never imports a trainer). Its ``fit`` starts new optimizer slots (Adam's moments at zero, ``step``
        from 1); the weights continue from here."""
        trainers = family("trainer")
        cls = trainers.get(self.package.record.trainer)
        if cls is None:
            raise TrainingPackageError(f"the package's trainer {self.package.record.trainer!r} is not a registered "
                                       f"trainer ({sorted(trainers)})")
        return cls.from_state(self, **params)


def load_training_state(folder: str | os.PathLike | TrainingPackage, state: bytes | str | os.PathLike) -> TrainingState:
    """The state file ``state`` (bytes or a path; :meth:`TrainingState.to_bytes`, the JavaScript library's
    ``exportState()``) of the package in ``folder``, checked: its format, that it comes from this package, its
    header's fields (counts below 2**53, no tensor twice), its tensors' names and shapes, its size (no byte missing
    or after the data; a file's header is read and checked before its data), finite values.
    ``.get_trained_onnx()`` is the trained prediction graph, ``.estimator()`` a trainer that goes on training.
    Nothing is written."""
    package = folder if isinstance(folder, TrainingPackage) else TrainingPackage(folder)
    what = "the state" if isinstance(state, (bytes, bytearray, memoryview)) else f"the state {str(state)!r}"
    header, data = read_state(state, what)
    if header.package_id != package.id:
        raise TrainingPackageError(f"{what} was trained from another package (package_id {header.package_id!r}, "
                                   f"this package's is {package.id!r})")
    tensors = decode_tensors(package.tensors, header.tensors, data, what)
    return TrainingState(package, tensors, header.epochs, header.steps, header.rows_seen, header.rows,
                         extra=dict(header.extra))


def average_states(states: Sequence[TrainingState]) -> TrainingState:
    """The mean of states of one package weighted by their ``rows`` (federated averaging), every tensor averaged;
    ``epochs`` and ``steps`` the largest, ``rows_seen`` and ``rows`` summed. Each state's ``rows`` is a count from 1
    to below 2**53, and so is their sum (the weights are computed exactly, whatever their size)."""
    if not states:
        raise TrainingPackageError("average_states needs at least one state")
    package = states[0].package
    if any(s.package.id != package.id for s in states):
        raise TrainingPackageError("average_states: the states come from different packages")
    for i, s in enumerate(states):
        if type(s.rows) not in (int, np.int64) or not 0 < s.rows < MAX_COUNT:
            raise TrainingPackageError(f"average_states: states[{i}].rows={s.rows!r}: every state needs rows, a "
                                       "count from 1 to below 2**53, to be weighted")
    rows = [int(s.rows) for s in states]
    total = sum(rows)
    if total >= MAX_COUNT:
        raise TrainingPackageError(f"average_states: the states hold {total} rows in all, not below 2**53")
    share = [float(Fraction(r, total)) for r in rows]
    tensors = {name: sum(p * s.tensors[name].astype(np.float64) for p, s in zip(share, states)).astype(np.float32)
               for name in states[0].tensors}
    return TrainingState(package, tensors, max(s.epochs for s in states), max(s.steps for s in states),
                         sum(s.rows_seen for s in states), total)


__all__ = ["TrainingPackage", "TrainingState", "average_states", "load_training_state"]
