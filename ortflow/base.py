"""``BaseTrainer``: the scikit-learn estimator and epoch loop shared by both training modes.

A subclass owns the onnxruntime side and implements the hooks below; the base class validates inputs, splits a
validation set, shuffles, runs epochs and callbacks, detects divergence, checkpoints and predicts.

Parameters are declared once in :mod:`ortflow.parameters` (``parameters`` of each subclass, from which its
``__init__`` is made) and checked in ``fit``. Hooks a subclass implements:

- ``_graph_spec(model) -> GraphSpec``: the feeds and outputs of ``model`` (already loaded and checked).
- ``_build_runtime(model, spec, rate)``: create the sessions for a fresh fit, ``rate`` the learning rate.
- ``_loss_object()``: the :class:`ortflow.losses.BaseLearningLoss` trained (for :meth:`BaseTrainer.losses`).
- ``_train_epoch(data, order, learning_rate) -> np.ndarray``: one epoch over ``self._batches`` of the rows of
  ``order`` (indices into ``data``; None: all of them as stored, see ``_unit_rows``), returning the loss of every
  batch (it stops early at a non-finite loss; the base reports it).
- ``_validation_loss(data) -> float``.
- ``_epoch_learning_rate(samples_seen) -> float | None``: the rate used for the coming epoch (for the record).
- ``get_state()``, ``_set_weights(state)``.
- ``_prediction_graph() -> onnx.ModelProto``: the prediction graph, weights not yet replaced.
- ``_graphs() -> dict[str, onnx.ModelProto | bytes]``: every graph the trainer uses, for ``save_onnx_graph``.
- ``_save_runtime_state(folder)`` / ``_load_runtime_state(folder)``: weights and optimizer state.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
from sklearn.base import BaseEstimator, clone
from sklearn.utils import check_random_state
from sklearn.utils.metaestimators import available_if

from . import checkpoint
from . import graph as g
from ._ort import InferenceSession, SessionOptions
from .callbacks import Callback, EarlyStopping, ProgressBar
from .exceptions import CheckpointError, ConvergenceError
from .learning_rates import BaseLearningRate, LearningRateSGD
from .ml_op_rewrites import make_trainable
from .parameters import check_parameters
from .registry import select
from .runtime import THREADS_WORK_THRESHOLD, OnnxFunction, make_session_options, threads_for_work
from .convert import ESTIMATOR_METADATA, graph_classes
from .frozen_prefix import FrozenPrefix
from .guards import exclusive_fit
from .prefetch import Prefetcher
from .sources import is_source, replays_order, source_identity
from .inputs import InputMapping
from .validation import check_device, check_positive_int, check_targets, check_weights_to_train, encode_labels

logger = logging.getLogger("ortflow")



@dataclass
class GraphSpec:
    """What a trainer feeds and reads: input, label, weight and prediction outputs."""

    inputs: InputMapping
    label_shape: list = field(default_factory=lambda: [None])
    weight_name: str | None = None
    prediction_outputs: list[str] = field(default_factory=list)
    trained_output: str | None = None  # the output the loss applies to (what predict returns for a regressor)
    classes: np.ndarray | None = None  # the classes of a classifier graph trained on its raw score

    @property
    def x_name(self) -> str:
        """The first data input (the only one but for tables)."""
        return self.inputs.names[0]

    @property
    def n_features(self) -> int | None:
        return self.inputs.n_features


@dataclass
class TrainData:
    """Validated arrays, converted once per fit and sliced per batch: ``feeds`` (one array per data input of the
    graph, see :mod:`ortflow.inputs`), float32 targets ``y`` and ``weight``."""

    feeds: dict[str, np.ndarray]
    y: np.ndarray
    weight: np.ndarray | None = None

    @property
    def n_samples(self) -> int:
        return len(self.y)

    @property
    def X(self) -> np.ndarray:
        """The feed of a graph with one data input."""
        if len(self.feeds) != 1:
            raise ValueError(f"the graph has {len(self.feeds)} data inputs {list(self.feeds)}, not one X")
        return next(iter(self.feeds.values()))

    def take(self, index) -> TrainData:
        w = None if self.weight is None else self.weight[index]
        return TrainData({k: v[index] for k, v in self.feeds.items()}, self.y[index], w)


class BaseTrainer(BaseEstimator):
    """Shared estimator surface. Subclasses declare ``parameters`` (their ``__init__`` comes from it) and the
    hooks."""

    parameters: tuple = ()

    # --- fitting -------------------------------------------------------------------------------------------
    @exclusive_fit
    def fit(self, X, y=None, sample_weight=None, validation_data=None, resume_from=None):
        """Train on (X, y); ``validation_data=(X_val, y_val)`` or ``validation_fraction`` adds validation losses.

        ``resume_from`` names a folder written by :meth:`save_checkpoint`: training continues after its last
        epoch with its weights, optimizer state and random state, up to ``max_iter`` epochs in all.

        A graph straight from skl2onnx holds ``ai.onnx.ml`` LinearRegressor / LinearClassifier nodes whose weights
        are attributes, out of any gradient's reach: ``fit`` trains :func:`ortflow.make_trainable`'s rewrite of it
        (MatMul/Add with the initializers ``coef``/``intercept``; a classifier gets ``raw_score`` and a float
        ``output_probability``), as a user handing over a scikit-learn model's graph expects. It does so on its
        own because the rewrite is unambiguous: it predicts what the original graph predicts and there is one way
        to write it; what cannot be rewritten (a tree ensemble, one-vs-rest scores) is refused naming the node.
        ``model_onnx`` is left as given; :meth:`get_trained_onnx` returns the rewritten graph, trained.

        ``X`` may also be a data source (:mod:`ortflow.sources`: a Parquet file or folder, Arrow data, memory-mapped
        arrays, a ``DataLoader``), read chunk by chunk with the next chunks prepared on a background thread; ``y``
        is then None (the source holds the target) and ``validation_data`` may be another source.
        """
        self._streamed_fit = is_source(X)
        if self._streamed_fit:
            return self._fit_source(X, y, sample_weight, validation_data, resume_from)
        model, spec, feeds, names, train_model, prefix = self._graph_and_feeds(X)
        data, val = self._prepare_data(spec, prefix, feeds, names, y, sample_weight, validation_data)
        check_positive_int("batch_size", self.batch_size, data.n_samples, "the number of training samples")
        rng = check_random_state(self.random_state)
        if val is None and self.validation_fraction is not None:
            data, val = self._split_validation(data, rng)
        rng, max_iter = self._begin(model, spec, train_model, feeds, names, rng, resume_from)

        def chunks(epoch):
            yield data, (rng.permutation(data.n_samples) if self.shuffle else None)

        self._rt_prefix, self._rng = prefix, rng
        self._train_epochs(range(len(self.history_), max_iter), chunks, lambda epoch: epoch * data.n_samples, val,
                           rng)
        self._samples_seen = len(self.history_) * data.n_samples
        return self

    def _fit_source(self, source, y, sample_weight, validation_data, resume_from):
        """``fit`` on a :class:`ortflow.sources.BatchSource`: the graph is set up from its first chunk, each epoch
        streams the source's chunks (converted and read ahead on a background thread), validation streams too.
        A checkpoint holds an epoch boundary, or a chunk boundary inside an epoch (``Checkpoint(every_rows=...)``),
        with the random state the epoch's order comes from: a resumed run replays the epoch's order and skips the
        rows already trained, so it ends as an uninterrupted run would."""
        if y is not None or sample_weight is not None:
            raise ValueError("fit(source, ...): the source holds the target and the sample weights; pass y=None")
        replays = replays_order(source)
        if not replays and any(getattr(cb, "every_rows", None) for cb in self.callbacks or []):
            raise ValueError(f"Checkpoint(every_rows=...) on {source!r}, {_NOT_REPLAYED}: a resume inside an epoch "
                             "could not replay it; checkpoint at epoch ends (every_rows=None) or use shuffle=False")
        # a few rows set the graph up: the source's head when it has one (one row group read), else its first chunk
        first = source.head(max(2, self.batch_size)) if hasattr(source, "head") else next(iter(source.chunks(None)),
                                                                                           None)
        if first is None or len(first[1]) == 0:
            raise ValueError(f"the source {source!r} yields no rows")
        model, spec, feeds, names, train_model, prefix = self._graph_and_feeds(first[0])
        self._prepare_data(spec, prefix, feeds, names, first[1], first[2], None)  # the first rows' checks
        identity = source_identity(source)
        rng, max_iter = self._begin(model, spec, train_model, feeds, names, check_random_state(self.random_state),
                                    resume_from, identity)
        resume, self._resumed_progress = self._resumed_progress, None
        if resume is not None and resume.rows and not replays:
            raise ValueError(f"resume_from={str(resume_from)!r} stopped inside epoch {resume.epoch + 1} of {source!r}, "
                             f"{_NOT_REPLAYED}: the rows trained before it cannot be told apart; resume from a "
                             "checkpoint at an epoch's end")
        if resume is not None and resume.rows and resume.epoch >= max_iter:
            raise ValueError(f"resume_from={str(resume_from)!r} stopped inside epoch {resume.epoch + 1}, which "
                             f"max_iter={self.max_iter} does not reach: its weights are not those of an epoch's end; "
                             f"resume with max_iter >= {resume.epoch + 1}")
        seen = [resume.samples_seen if resume is not None else
                0 if source.n_rows is None else source.n_rows * len(self.history_)]

        def convert(chunk_source, order_rng, count: bool, skip: int = 0):
            """The epoch's units ``(data, order)`` of whole batches (the last one may be short), from row ``skip``
            on: the rows before it are skipped by the source when it can, else read (the order and random state
            depend on them) but neither converted nor trained. A chunk the source yields with its rows' order
            stays as read, the trainer gathering each batch; the rows left over at a chunk's end (fewer than a
            batch) are copied out and joined to the next chunk's first rows."""
            skipped = bool(skip) and getattr(chunk_source, "skips_rows", False)  # the source skips them itself
            carry, read, bs = None, skip if skipped else 0, self.batch_size
            if count:
                seen[0] += skip
            for item in (chunk_source.chunks(order_rng, skip_rows=skip) if skipped
                         else chunk_source.chunks(order_rng)):
                X, y_part, w_part, order = item if len(item) == 4 else (*item, None)
                n = len(y_part) if order is None else len(order)
                read += n
                if read <= skip:
                    continue
                f, _ = spec.inputs.feeds(X, _matrix_width(spec, feeds), names)
                data, _ = self._prepare_data(spec, prefix, f, names, y_part, w_part, None)
                start = max(0, skip - (read - n))  # the rows of this chunk trained before a resume
                if carry is not None:
                    end = min(n, start + bs - carry.n_samples)
                    carry, start = _concat(carry, _rows(data, order, start, end)), end
                    if carry.n_samples < bs:
                        continue
                    if count:
                        seen[0] += bs
                    yield carry, None
                    carry = None
                whole = start + (n - start) // bs * bs
                if whole > start:
                    if count:
                        seen[0] += whole - start
                    yield (data.take(slice(start, whole)), None) if order is None else (data, order[start:whole])
                if whole < n:
                    carry = _rows(data, order, whole, n)
            if carry is not None:
                if count:
                    seen[0] += carry.n_samples
                yield carry, None

        def chunks(epoch):
            skip = resume.rows if resume is not None and epoch == resume.epoch else 0
            with Prefetcher(convert(source, rng if self.shuffle else None, True, skip), self.prefetch_depth) as ahead:
                yield from ahead

        val = None
        if validation_data is not None:
            if not is_source(validation_data):
                raise TypeError("fit(source, validation_data=...): the validation data must be a source too "
                                "(source.split(fraction, key=...) holds part of it out)")
            val = _StreamedValidation(lambda: convert(validation_data, None, False))
        self._rt_prefix, self._rng = prefix, rng
        self._train_epochs(range(len(self.history_), max_iter), chunks, lambda epoch: seen[0], val, rng,
                           streamed=identity, resume=resume)
        self._samples_seen = seen[0]
        return self

    @exclusive_fit
    def partial_fit(self, X, y, sample_weight=None):
        """One pass over (X, y) in batches of ``batch_size``, continuing from the previous call (the first call
        builds the runtime from ``model_onnx``). A loop of ``partial_fit`` calls over batches of a large table trains
        as scikit-learn's ``SGDRegressor.partial_fit`` does (after ``fit``, it continues from the fitted weights);
        each call adds one record to ``history_``, and the learning rate follows the samples seen across calls.
        ``max_iter``, ``validation_fraction`` and early stopping do not apply."""
        first = not hasattr(self, "history_")
        if first:
            model, spec, feeds, names, train_model, prefix = self._graph_and_feeds(X)
        else:
            spec = self._spec
            feeds, names = spec.inputs.feeds(X, _fitted_width(self), _fitted_names(self))
            prefix = self._rt_prefix if hasattr(self, "_rt_prefix") else self._split_again(feeds)
        data, _ = self._prepare_data(spec, prefix, feeds, names, y, sample_weight, None)
        if first:
            self._start(model, spec, train_model)
            self._fitted_inputs(spec, feeds, names)
            self._samples_seen = 0
            self._rng = check_random_state(self.random_state)
        self._rt_prefix = prefix
        rng, seen = self._rng, self._samples_seen

        def chunks(epoch):
            yield data, (rng.permutation(data.n_samples) if self.shuffle else None)

        self._train_epochs(range(len(self.history_), len(self.history_) + 1), chunks, lambda epoch: seen, None, rng)
        self._samples_seen += data.n_samples
        return self

    def _begin(self, model, spec, train_model, feeds, names, rng, resume_from, streamed=None):
        """A fresh start (or a warm one, checked), the fitted inputs recorded, a checkpoint restored: ``(random
        state, the epoch to stop at)``; ``streamed`` is the identity of the source a streamed fit reads (None in
        memory), ``_resumed_progress`` the progress of the epoch a mid-epoch checkpoint stopped in (else None)."""
        self._resumed_progress = None
        warm = self.warm_start and hasattr(self, "history_") and resume_from is None
        if warm:
            self._check_warm_start(model, spec)
        else:
            self._start(model, spec, train_model)
        self._fitted_inputs(spec, feeds, names)
        if resume_from is not None:
            rng = self._restore_checkpoint(resume_from, rng, streamed)
        return rng, int(self.max_iter) + (len(self.history_) if warm else 0)

    def _graph_and_feeds(self, X):
        """Validate the parameters and the graph; ``(model, spec, feeds, column names, trainable part, frozen
        prefix)`` for the data ``X``."""
        check_parameters(self)
        model = g.load_model(self.model_onnx)
        g.check_loadable(model)
        model = make_trainable(model, self.weights_to_train)  # the same graph when it holds no ai.onnx.ml linear op
        spec = self._graph_spec(model)
        spec.classes = _trained_classes(model, spec)
        feeds, names = spec.inputs.feeds(X)
        _resolve_symbolic_width(model, spec, feeds)
        output = self._trained_output_name(spec)
        weights = self._check_weights(model, g.keep_outputs(model, [output]), output)
        train_model, prefix = FrozenPrefix.split(model, weights, spec.inputs.names, [output], feeds)
        return model, spec, feeds, names, train_model, prefix

    def _split_again(self, feeds) -> FrozenPrefix | None:
        """The frozen prefix of the fitted graph (an unpickled estimator holds no session)."""
        return FrozenPrefix.split(self._model, self.weights_to_train_, self._spec.inputs.names,
                                  [self._trained_output_name(self._spec)], feeds)[1]

    def _start(self, model, spec, train_model) -> None:
        """A fresh training: the runtime built on the trainable part, an empty history."""
        self._spec = spec
        self._model = model
        self._train_model = train_model
        self._fit_settings = self._settings()
        self.n_threads_ = self._threads(train_model)
        self._build_runtime(train_model, spec, self._learning_rate())
        self.history_ = []
        self._append(None)

    def _fitted_inputs(self, spec, feeds, names) -> None:
        """``n_features_in_`` and ``feature_names_in_`` of the data fit saw."""
        self.n_features_in_ = _n_features(spec, feeds)
        if names is not None:
            self.feature_names_in_ = np.asarray(names, dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        self._predict_sess = None

    def _train_epochs(self, epochs: range, chunks, samples_seen, val, rng, streamed=None, resume=None):
        """Train the ``epochs``: epoch ``e`` runs over ``chunks(e)`` (pairs ``(TrainData, row order or None)``)
        at the learning rate of ``samples_seen(e)`` samples; validation, records, callbacks, divergence.

        A streamed fit (``streamed``: its source's identity) follows its progress through each epoch, chunk by
        chunk, for the callbacks' ``on_chunk_end`` and mid-epoch checkpoints; ``resume`` is the progress a
        mid-epoch checkpoint restored, continued by the first epoch."""
        every = self._validation_period()
        self.stop_training_ = False
        self.diverged_ = False
        self.in_epoch_ = False
        self._at_chunk = None
        self._next_seen = None  # a stream's samples seen before its next epoch, for its epoch-boundary checkpoints
        callbacks = self._callbacks()
        for cb in callbacks:
            cb.on_train_begin(self)
        last_good = self.get_state() if not self.exc else None
        log = self.enable_logging and logger.isEnabledFor(logging.INFO)
        try:
            for epoch in epochs:
                begin = time.perf_counter()
                seen = samples_seen(epoch)
                learning_rate = self._epoch_learning_rate(seen)
                progress = None
                if resume is not None and resume.epoch == epoch:
                    progress = resume
                    begin -= progress.elapsed
                elif streamed is not None:
                    progress = _Progress(epoch, streamed, rng.get_state(), seen)
                if progress is not None:
                    progress.begin = begin
                self.in_epoch_ = True  # weights are mid-epoch until the epoch ends: no checkpoint then
                losses, sizes, complete = self._epoch(chunks(epoch), learning_rate, progress, callbacks)
                self.in_epoch_ = False
                if not complete or not len(losses):
                    self._diverged(epoch, losses, learning_rate, last_good)
                    break
                record = {
                    "epoch": epoch + 1,
                    "train_loss": float(np.dot(losses, sizes) / sizes.sum()),
                    "validation_loss": None,
                    "learning_rate": learning_rate,
                    "time": None,
                }
                if val is not None and (epoch + 1) % every == 0:
                    record["validation_loss"] = float(self._validation_value(val))
                record["time"] = time.perf_counter() - begin
                self._append(record)
                if log:
                    logger.info("%s epoch %d: %s", type(self).__name__, epoch + 1, record)
                    logger.debug("batch losses of epoch %d: %s", epoch + 1, losses.tolist())
                self._rng_state = rng.get_state()
                if streamed is not None:
                    self._next_seen = int(samples_seen(epoch + 1))
                if last_good is not None:
                    last_good = self.get_state()
                for cb in callbacks:
                    cb.on_epoch_end(self, record)
                if self.stop_training_:
                    break
        finally:
            for cb in callbacks:
                cb.on_train_end(self)
        return self

    def _validation_value(self, val) -> float:
        """The validation loss of ``val``: in-memory data, or a stream's chunks (their losses weighted by rows)."""
        if isinstance(val, TrainData):
            return self._validation_loss(val)
        total, rows = 0.0, 0
        for data, order in val.chunks():
            data = data if order is None else data.take(order)
            total += self._validation_loss(data) * data.n_samples
            rows += data.n_samples
        return total / rows

    def _epoch(self, chunks, learning_rate, progress=None, callbacks=()) -> tuple[np.ndarray, np.ndarray, bool]:
        """``(loss, row count)`` of every batch over ``chunks``, and whether every batch ran: the trainers stop
        at the first non-finite loss. A streamed epoch's ``progress`` (resumed or new) holds the batches so far and
        is advanced after each chunk, where the ``callbacks``' ``on_chunk_end`` run (weights at a chunk boundary:
        a checkpoint may be written then, nowhere else inside the epoch)."""
        losses, sizes = ([np.empty(0)], [np.empty(0)]) if progress is None else (progress.losses, progress.sizes)
        for data, order in chunks:
            chunk = self._train_epoch(data, order, learning_rate)
            rows = self._unit_rows(data, order)
            full = self._batch_sizes(rows)
            losses.append(np.asarray(chunk, dtype=np.float64))
            sizes.append(full[: len(chunk)])
            if len(chunk) < len(full) or not np.isfinite(chunk).all():
                return np.concatenate(losses), np.concatenate(sizes), False
            if progress is not None:
                progress.chunks += 1
                progress.rows += rows
                self._at_chunk = progress
                try:
                    for cb in callbacks:
                        cb.on_chunk_end(self, progress.position())
                finally:
                    self._at_chunk = None
        return np.concatenate(losses), np.concatenate(sizes), True

    def _prepare_data(self, spec, prefix, feeds, names, y, sample_weight, validation_data):
        """The training and validation data: targets checked, the feeds of the trainable part (the frozen
        prefix's outputs when the graph has one, see :mod:`ortflow.frozen_prefix`)."""
        n_rows = len(next(iter(feeds.values())))
        y, w = check_targets(_targets(spec, y), sample_weight, n_rows, spec.label_shape)
        if w is not None and spec.weight_name is None:
            raise ValueError(
                "sample_weight was given but the graph has no weight input: add one "
                "(add_loss_output(..., weight_name='weight')) or set the trainer's weight input name"
            )
        if spec.weight_name is not None and w is None:
            w = np.ones(n_rows, dtype=np.float32)
        val = None
        if validation_data is not None:
            if len(validation_data) != 2:
                raise ValueError("validation_data must be a pair (X_val, y_val)")
            feeds_v, _ = spec.inputs.feeds(validation_data[0], _matrix_width(spec, feeds), names)
            yv, _ = check_targets(_targets(spec, validation_data[1]), None, len(next(iter(feeds_v.values()))),
                                  spec.label_shape)
            wv = None if spec.weight_name is None else np.ones(len(yv), dtype=np.float32)
            val = TrainData(feeds_v if prefix is None else prefix.transform(feeds_v), yv, wv)
        return TrainData(feeds if prefix is None else prefix.transform(feeds), y, w), val

    def _split_validation(self, data: TrainData, rng) -> tuple[TrainData, TrainData]:
        fraction = float(self.validation_fraction)
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"validation_fraction={self.validation_fraction!r} must be in (0, 1)")
        n_val = int(round(fraction * data.n_samples))
        if n_val < 1 or data.n_samples - n_val < self.batch_size:
            raise ValueError(
                f"validation_fraction={fraction} of {data.n_samples} samples leaves too few samples "
                f"(validation {n_val}, training {data.n_samples - n_val}, batch_size {self.batch_size})"
            )
        perm = rng.permutation(data.n_samples)
        train, val = data.take(np.sort(perm[n_val:])), data.take(np.sort(perm[:n_val]))
        if val.weight is not None:
            val.weight = np.ones(val.n_samples, dtype=np.float32)
        return train, val

    def _callbacks(self) -> list[Callback]:
        callbacks = list(self.callbacks or [])
        if self.early_stopping:
            callbacks.append(EarlyStopping(patience=self.n_iter_no_change, tol=self.tol))
        if self.verbose:
            callbacks.append(ProgressBar())
        return callbacks

    def _validation_period(self) -> int:
        """Epochs between two validations: ``validation_every`` itself, or that fraction of ``max_iter``."""
        every = self.validation_every
        if isinstance(every, float):
            return max(1, int(round(every * self.max_iter)))
        return int(every)

    def _learning_rate(self) -> BaseLearningRate:
        """``learning_rate`` as a fresh :class:`BaseLearningRate`: a float is SGD at that rate following
        ``lr_schedule`` and ``power_t``; a name is that class with its defaults; an instance is cloned."""
        value = self.learning_rate
        if isinstance(value, (str, BaseLearningRate)):
            rate = clone(select("optimizer", value))
        else:
            rate = LearningRateSGD(eta0=float(value), learning_rate=self.lr_schedule, power_t=self.power_t)
        rate.check()
        return rate

    def _settings(self) -> dict:
        """The parameters a warm start cannot change (the runtime was built from them)."""
        fixed = ("learning_rate", "lr_schedule", "power_t", "device", "weights_to_train", "n_threads",
                 *self._runtime_parameters)
        return {k: repr(getattr(self, k)) for k in fixed}

    def _trained_output_name(self, spec: GraphSpec) -> str:
        """The output training reduces: the prediction the loss applies to (the loss output in full training)."""
        return spec.trained_output

    #: subclass parameters the runtime is built from (a warm start refuses a change of them)
    _runtime_parameters: tuple = ()

    def _check_warm_start(self, model: onnx.ModelProto, spec: GraphSpec) -> None:
        changed = [k for k, v in self._settings().items() if self._fit_settings.get(k) != v]
        if changed:
            raise ValueError(f"warm_start=True but {changed} changed since the last fit: the runtime was built "
                             "with the old values; set warm_start=False to start a new training")
        if model.SerializeToString() != self._model.SerializeToString():
            raise ValueError("warm_start=True but model_onnx changed since the last fit: set warm_start=False to "
                             "train the new graph")

    def _check_weights(self, model: onnx.ModelProto, trained_graph: onnx.ModelProto, output: str) -> list[str]:
        """``weights_to_train`` checked against ``model``, every one of them used by ``trained_graph`` (the graph
        pruned to ``output``); None means every float initializer ``trained_graph`` uses."""
        weights = check_weights_to_train(model if self.weights_to_train is not None else trained_graph,
                                         self.weights_to_train)
        kept = {i.name for i in trained_graph.graph.initializer}
        unused = [w for w in weights if w not in kept]
        if unused:
            raise ValueError(f"weights_to_train names {unused}, which do not influence {output!r}")
        return weights

    def _batches(self, n_samples: int, order: np.ndarray | None):
        """Yield row selections of each batch: a slice (a view, no copy) or the shuffled indices."""
        bs = self.batch_size
        for start in range(0, n_samples, bs):
            yield slice(start, start + bs) if order is None else order[start : start + bs]

    @staticmethod
    def _unit_rows(data: TrainData, order) -> int:
        """The rows a unit ``(data, order)`` trains: those of ``order`` (indices into ``data``) when given."""
        return data.n_samples if order is None else len(order)

    def _batch_sizes(self, n_samples: int) -> np.ndarray:
        sizes = np.full((n_samples + self.batch_size - 1) // self.batch_size, self.batch_size, dtype=np.float64)
        sizes[-1] = n_samples - self.batch_size * (len(sizes) - 1)
        return sizes

    def _append(self, record: dict | None) -> None:
        if record is not None:
            self.history_.append(record)
        self.train_losses_ = [r["train_loss"] for r in self.history_]
        self.validation_losses_ = [r["validation_loss"] for r in self.history_ if r["validation_loss"] is not None]
        self.n_iter_ = len(self.history_)

    def _diverged(self, epoch: int, losses: np.ndarray, learning_rate, last_good) -> None:
        bad = [i for i, v in enumerate(losses) if not np.isfinite(v)]
        batch = bad[0] if bad else len(losses)
        value = losses[batch] if bad else float("nan")
        message = (
            f"training loss is {value} at epoch {epoch + 1}, batch {batch + 1} (learning_rate={learning_rate}): "
            "the model diverged; lower the learning rate or scale the data"
        )
        self.diverged_ = True
        if self.exc:
            raise ConvergenceError(message, epoch=epoch + 1, batch=batch + 1)
        warnings.warn(message + "; the weights of the last finite epoch are kept", RuntimeWarning, stacklevel=3)
        self.set_state(last_good)
        self.stop_training_ = True

    # --- state ---------------------------------------------------------------------------------------------
    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Set the trained weights from a dict name -> array (as returned by :meth:`get_state`)."""
        self._check_fitted()
        unknown = sorted(set(state) - set(self.weights_to_train_))
        if unknown:
            raise KeyError(f"set_state: {unknown} are not trained weights; trained: {self.weights_to_train_}")
        self._set_weights({k: np.asarray(v, dtype=np.float32) for k, v in state.items()})
        self._predict_sess = None

    def get_trained_onnx(self) -> onnx.ModelProto:
        """The prediction graph with the trained weights, loadable by a plain InferenceSession."""
        self._check_fitted()
        trained = g.replace_initializers(self._prediction_graph(), self.get_state())
        # the estimator the graph came from stays recorded (the loss record does not: the graph has no loss)
        trained.metadata_props.extend(e for e in self._model.metadata_props if e.key == ESTIMATOR_METADATA)
        return trained

    def save_onnx_graph(self, folder: str | os.PathLike | None = None) -> dict[str, str] | dict[str, bytes]:
        """Every graph the trainer uses, and the trained model: written into ``folder`` (name -> path), or,
        without a folder, serialized in memory (name -> bytes)."""
        self._check_fitted()
        graphs = dict(self._graphs())
        graphs["trained_model"] = self.get_trained_onnx()
        serialized = {name: proto if isinstance(proto, bytes) else proto.SerializeToString()
                      for name, proto in graphs.items()}
        return serialized if folder is None else g.save_graphs(serialized, folder)

    # --- checkpoints ---------------------------------------------------------------------------------------
    def save_checkpoint(self, folder: str | os.PathLike) -> str:
        """Write weights, optimizer state, history and random state to ``folder`` (replaced atomically, every file
        checksummed). It holds an epoch boundary, or, called from a callback's ``on_chunk_end`` during a streamed
        fit, a chunk boundary inside an epoch: the position (chunks and rows trained), the random state at the
        epoch's start (the source's order is replayed from it), the samples seen before it, the source's identity
        and the batch losses so far (``epoch_losses.npz``). Refused anywhere else in the middle of an epoch."""
        self._check_fitted()
        at = getattr(self, "_at_chunk", None)
        if getattr(self, "in_epoch_", False) and at is None:
            raise RuntimeError("save_checkpoint in the middle of an epoch (training was interrupted): the weights "
                               "are not those of a completed epoch; the last checkpoint written stays valid")
        rng_state = getattr(self, "_rng_state", None) if at is None else at.rng_state
        meta = {
            "trainer": type(self).__name__,
            "fingerprint": self._fingerprint(),
            "epoch": len(self.history_),
            "history": self.history_,
            "rng_state": None if rng_state is None else [rng_state[0], rng_state[1].tolist(), *rng_state[2:]],
        }
        if at is None:
            if getattr(self, "_next_seen", None) is not None:
                meta["samples_seen"] = self._next_seen
            return checkpoint.write(folder, self._save_runtime_state, meta)
        meta["position"] = {**at.record(), "batch_size": int(self.batch_size), "shuffle": bool(self.shuffle)}

        def save_state(tmp: str) -> None:
            self._save_runtime_state(tmp)
            np.savez(os.path.join(tmp, EPOCH_LOSSES), **at.batches(self.batch_size))

        return checkpoint.write(folder, save_state, meta)

    def _fingerprint(self) -> str:
        return checkpoint.fingerprint(self._model.SerializeToString(), self.weights_to_train_)

    def _restore_checkpoint(self, folder, rng, streamed=None):
        """The checkpoint in ``folder`` restored (``rng`` set to its random state). One written inside a streamed
        epoch is refused unless this fit streams the same source with the same batches; a streamed fit resuming a
        stream's checkpoint keeps in ``_resumed_progress`` what its next epoch continues: the samples seen before
        it (a source may not know its rows) and, inside an epoch, the position and batch losses."""
        meta = checkpoint.read(folder, type(self).__name__, self._fingerprint())
        position = meta.get("position")
        if position is not None:
            self._resumed_progress = self._check_position(folder, meta["epoch"], position, streamed)
        elif streamed is not None and meta.get("samples_seen") is not None:  # a stream's epoch boundary
            self._resumed_progress = _Progress(meta["epoch"], streamed, None, meta["samples_seen"])
        self._load_runtime_state(str(folder))
        self.history_ = []
        self._append(None)
        for record in meta["history"]:
            self._append(record)
        if meta["rng_state"] is not None:
            name, keys, *rest = meta["rng_state"]
            rng.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
        if self._resumed_progress is not None:
            self._resumed_progress.rng_state = rng.get_state()
        return rng

    def _check_position(self, folder, epoch: int, position: dict, streamed: dict | None) -> _Progress:
        """The progress of the epoch a mid-epoch checkpoint stopped in (after ``epoch`` complete ones), once this
        fit can continue it."""
        where = (f"resume_from={str(folder)!r} stopped inside epoch {epoch + 1} of a streamed fit "
                 f"({position['rows']} rows trained)")
        if streamed is None:
            raise CheckpointError(f"{where}: an in-memory fit cannot continue it; resume with fit(source, "
                                  "resume_from=...) on the source it streamed")
        now = {"source": streamed, "batch_size": int(self.batch_size), "shuffle": bool(self.shuffle)}
        for key, value in now.items():
            if position.get(key) != value:
                if key == "source":
                    before = position.get(key) or {}
                    detail = "; ".join(f"{k}: {before.get(k)!r} then, {value.get(k)!r} now"
                                       for k in sorted({*before, *value}) if before.get(k) != value.get(k))
                    raise CheckpointError(f"{where} of another source ({detail}): its order and rows would differ; "
                                          "resume on the source it streamed")
                raise CheckpointError(f"{where} with {key}={position.get(key)!r}, not {value!r}: the epoch's "
                                      f"batches would differ; resume with {key}={position.get(key)!r}")
        stored = checkpoint.load_arrays(folder, EPOCH_LOSSES, "batch losses of the interrupted epoch")
        sizes = np.full(len(stored["losses"]), float(self.batch_size))
        sizes[stored["short"]] = stored["short_sizes"]
        return _Progress(epoch, streamed, None, position["samples_seen"], position["chunks"],
                         position["rows"], [stored["losses"]], [sizes], position["elapsed"])

    # --- prediction ----------------------------------------------------------------------------------------
    def predict(self, X) -> np.ndarray:
        """Labels for a classifier graph, else the trained output (raveled when it has one column)."""
        outputs = self._run_prediction(X)
        name = "output_label" if "output_label" in outputs else self._spec.trained_output or next(iter(outputs))
        pred = outputs[name]
        return pred.ravel() if pred.ndim == 2 and pred.shape[1] == 1 else pred

    @available_if(lambda self: _has_probabilities(self))
    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities (classifier graphs with an ``output_probability`` output; a trainer of any other
        graph has no ``predict_proba``, so ``hasattr`` tells scikit-learn's tools which it is)."""
        return self._run_prediction(X)["output_probability"]

    def score(self, X, y, sample_weight=None) -> float:
        """Accuracy for a classifier graph, R² otherwise."""
        from sklearn.metrics import accuracy_score, r2_score

        pred = self.predict(X)
        if self._is_classifier():
            return float(accuracy_score(np.asarray(y).ravel(), pred, sample_weight=sample_weight))
        y = np.asarray(y)
        return float(r2_score(y.reshape(pred.shape), pred, sample_weight=sample_weight))

    def _is_classifier(self) -> bool:
        self._check_fitted()
        return "output_label" in self._spec.prediction_outputs

    @property
    def classes_(self) -> np.ndarray:
        """The classes of a classifier graph (the order of ``predict_proba``'s columns)."""
        self._check_fitted()
        if self._spec.classes is None:
            raise AttributeError(f"{type(self).__name__} trains a graph that carries no classes (not a classifier)")
        return self._spec.classes

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        if _graph_is_classifier(self.model_onnx):
            from sklearn.utils import ClassifierTags

            tags.estimator_type = "classifier"
            tags.classifier_tags = ClassifierTags()
        return tags

    def _run_prediction(self, X, names: list[str] | None = None) -> dict[str, np.ndarray]:
        return self._run_feeds(self._feeds(X), names)

    def _run_feeds(self, feeds: dict[str, np.ndarray], names: list[str] | None = None) -> dict[str, np.ndarray]:
        if self._predict_sess is None:
            self._predict_sess = InferenceSession(
                self.get_trained_onnx().SerializeToString(), self._session_options(), providers=self._providers()
            )
        names = names or self._spec.prediction_outputs
        return dict(zip(names, self._predict_sess.run(names, feeds)))

    def _feeds(self, X) -> dict[str, np.ndarray]:
        """``X`` as the prediction graph's feeds, checked against what fit saw (width, column names)."""
        self._check_fitted()
        return self._spec.inputs.feeds(X, _fitted_width(self), _fitted_names(self))[0]

    def losses(self, X, y, sample_weight=None) -> np.ndarray:
        """The loss of every sample under the trained weights, ``w * l`` (no penalty): shape (n,)."""
        feeds = self._feeds(X)
        y, w = check_targets(_targets(self._spec, y), sample_weight, len(next(iter(feeds.values()))),
                             self._spec.label_shape)
        output = self._spec.trained_output
        prediction = self._run_feeds(feeds, [output])[output]
        rank = prediction.ndim
        width = prediction.shape[1] if rank == 2 else None
        loss = self._loss_object()
        function = OnnxFunction(loss.build_per_sample_function(rank=rank, width=width), "cpu")
        per = function.run(prediction, y.reshape(prediction.shape))[0].numpy()
        return per if w is None else per * w

    def _loss_object(self):
        raise NotImplementedError

    # --- helpers for subclasses ----------------------------------------------------------------------------
    def _providers(self) -> list[str]:
        return check_device(self.device)[1]

    def _session_options(self) -> SessionOptions:
        """The training sessions' options: ``n_threads_`` intra-op threads, spinning as ``spinning`` says (None:
        not in a streamed fit, where the reader thread needs a core)."""
        options = make_session_options(getattr(self, "n_threads_", self.n_threads))
        if not self._spinning():
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return options

    def _spinning(self) -> bool:
        spinning = getattr(self, "spinning", None)  # None in an estimator pickled before the parameter
        return spinning if spinning is not None else not getattr(self, "_streamed_fit", False)

    def _threads(self, model: onnx.ModelProto) -> int:
        """``n_threads`` when set, else the count :func:`ortflow.runtime.threads_for_work` picks for a batch of
        ``batch_size`` rows through ``model``'s float weights."""
        if self.n_threads is not None:
            return int(self.n_threads)
        return threads_for_work(self.batch_size, g.float_weight_count(model), self.device,
                                self._threads_threshold())

    def _threads_threshold(self) -> int:
        """The work under which one thread beats all cores for this trainer (:mod:`ortflow.runtime`)."""
        return THREADS_WORK_THRESHOLD

    def _check_fitted(self) -> None:
        if not hasattr(self, "history_"):
            from sklearn.exceptions import NotFittedError

            raise NotFittedError(f"this {type(self).__name__} is not fitted yet: call fit first")

    def __getstate__(self):
        state = self.__dict__.copy()
        if hasattr(self, "history_"):
            state["_pickled_weights"] = self.get_state()
        for key in [k for k in state if k.startswith("_rt_")] + ["_predict_sess"]:
            state.pop(key, None)
        return state

    def __setstate__(self, state):
        weights = state.pop("_pickled_weights", None)
        self.__dict__.update(state)
        self._predict_sess = None
        if weights is not None:
            self._build_runtime(self._train_model, self._spec, self._learning_rate())
            self._set_weights(weights)


def prediction_spec(model: onnx.ModelProto, output_name, weight_name: str | None) -> GraphSpec:
    """The spec of a prediction graph (no loss inside) trained on one float output: ``output_name`` picks it
    (None: the only one, or ``raw_score`` when present); sample weights enter as ``weight_name`` (default
    ``'weight'``). Shared by the trainers that add the loss themselves."""
    output = g.pick_output(model, output_name, "output_name")
    if g.elem_type(model, output) != onnx.TensorProto.FLOAT:
        raise ValueError(f"output {output!r} is {g.type_name(model, output)}, not float32: only float32 predictions "
                         "can be trained; convert the graph to float32 (its weights, inputs and casts) first")
    shape = g.shape_of(model, output)
    if len(shape) not in (1, 2):
        raise ValueError(f"output {output!r} has rank {len(shape)}; the losses expect (N,) or (N, k)")
    return GraphSpec(inputs=InputMapping.of(model), label_shape=shape, weight_name=weight_name or "weight",
                     prediction_outputs=g.output_names(model), trained_output=output)


def _trained_classes(model: onnx.ModelProto, spec: GraphSpec) -> np.ndarray | None:
    """The classes a graph carries when the trained output is its raw score (not probabilities or labels)."""
    if spec.trained_output in ("output_probability", "output_label", "probabilities", "label"):
        return None
    return graph_classes(model)


def _targets(spec: GraphSpec, y):
    """What the loss takes for ``y``: class labels encoded for a classifier graph, ``y`` itself otherwise."""
    if spec.classes is None:
        return y
    width = spec.label_shape[1] if len(spec.label_shape) == 2 and isinstance(spec.label_shape[1], int) else None
    return encode_labels(y, spec.classes, width)


def _has_probabilities(trainer) -> bool:
    """Whether the trainer's graph outputs ``output_probability`` (its prediction graph once fitted)."""
    spec = getattr(trainer, "_spec", None)
    if spec is not None:
        return "output_probability" in spec.prediction_outputs
    try:
        return any(o.name == "output_probability" for o in g.load_model(trainer.model_onnx).graph.output)
    except Exception:  # noqa: BLE001 - fit reports an unreadable graph with the reason
        return False


def _graph_is_classifier(model_onnx) -> bool:
    """Whether ``model_onnx`` (not yet validated) carries classes; False when it cannot be read."""
    try:
        return graph_classes(model_onnx) is not None
    except Exception:  # noqa: BLE001 - fit reports an unreadable graph with the reason
        return False


#: the file of a mid-epoch checkpoint holding the epoch's batch losses and sizes so far
EPOCH_LOSSES = "epoch_losses.npz"


@dataclass(frozen=True)
class StreamPosition:
    """Where a streamed fit stands at a chunk boundary, handed to :meth:`Callback.on_chunk_end`: ``epoch`` (the
    epoch in progress, 1-based as in its record), the ``chunks`` and ``rows`` of it trained so far."""

    epoch: int
    chunks: int
    rows: int


class _Progress:
    """A streamed epoch's progress: the batch losses and sizes so far, the chunks and rows trained, and what the
    epoch started from (random state, samples seen before it), with the source's identity: what a mid-epoch
    checkpoint holds. ``epoch`` is 0-based."""

    def __init__(self, epoch: int, source: dict, rng_state, samples_seen: int, chunks: int = 0, rows: int = 0,
                 losses=None, sizes=None, elapsed: float = 0.0):
        self.epoch, self.source, self.rng_state, self.samples_seen = epoch, source, rng_state, int(samples_seen)
        self.chunks, self.rows, self.elapsed = chunks, rows, elapsed
        self.losses, self.sizes = losses or [np.empty(0)], sizes or [np.empty(0)]
        self.begin = 0.0  # the epoch's start (time.perf_counter, less the elapsed time before a resume)

    def position(self) -> StreamPosition:
        return StreamPosition(self.epoch + 1, self.chunks, self.rows)

    def batches(self, batch_size: int) -> dict[str, np.ndarray]:
        """The batch losses so far and, of their sizes, those of the batches shorter than ``batch_size`` (one per
        chunk at most): 8 bytes a batch, not 16."""
        sizes = np.concatenate(self.sizes)
        short = np.flatnonzero(sizes != batch_size)
        return {"losses": np.concatenate(self.losses), "short": short, "short_sizes": sizes[short]}

    def record(self) -> dict:
        """The manifest's ``position`` in the epoch after its ``epoch`` complete ones (the losses go to their own
        file)."""
        return {"chunks": self.chunks, "rows": self.rows, "samples_seen": self.samples_seen,
                "elapsed": time.perf_counter() - self.begin, "source": self.source}


class _StreamedValidation:
    """Validation data read from a source at each validation (never held whole)."""

    def __init__(self, chunks):
        self.chunks = chunks


#: what a source that does not replay its epochs (:func:`ortflow.sources.replays_order`) is, in the errors
_NOT_REPLAYED = "whose epochs come in an order drawn from torch's random state (a DataLoader with shuffle=True)"


def _rows(data: TrainData, order, start: int, stop: int) -> TrainData:
    """Rows ``start:stop`` of a chunk in its training order (``order``, or as stored when None), copied out."""
    return data.take(slice(start, stop) if order is None else order[start:stop])


def _concat(a: TrainData, b: TrainData) -> TrainData:
    """The rows of ``a`` then ``b`` (a stream's leftover rows joined to its next chunk)."""
    feeds = {k: np.concatenate([a.feeds[k], b.feeds[k]]) for k in a.feeds}
    weight = None if a.weight is None else np.concatenate([a.weight, b.weight])
    return TrainData(feeds, np.concatenate([a.y, b.y]), weight)


def _fitted_width(trainer) -> int | None:
    """The matrix width fit saw, when the graph leaves it symbolic (None for tables and fixed widths)."""
    inputs = trainer._spec.inputs
    return trainer.n_features_in_ if inputs.n_features is None and not inputs.is_table else None


def _fitted_names(trainer) -> list[str] | None:
    names = getattr(trainer, "feature_names_in_", None)
    return None if names is None else list(names)


def _matrix_width(spec: GraphSpec, feeds: dict[str, np.ndarray]) -> int | None:
    """The width of a single matrix input (the graph may leave it symbolic), None for any other input."""
    if spec.inputs.is_table:
        return None
    array = next(iter(feeds.values()))
    return array.shape[1] if array.ndim == 2 else None


def _n_features(spec: GraphSpec, feeds: dict[str, np.ndarray]) -> int:
    """scikit-learn's ``n_features_in_``: the matrix's width, the number of columns of a table, the number of values
    of one sample otherwise (an image's pixels)."""
    if spec.inputs.is_table:
        return len(feeds)
    array = next(iter(feeds.values()))
    return int(np.prod(array.shape[1:], dtype=np.int64))


def _resolve_symbolic_width(model: onnx.ModelProto, spec: GraphSpec, feeds: dict[str, np.ndarray]) -> None:
    """A trained output whose column count is symbolic gets its real width from a run on one row, so a ``y`` of
    another width is refused instead of broadcast against it (a 1-column model would learn the mean of 2 columns)."""
    if len(spec.label_shape) != 2 or isinstance(spec.label_shape[1], int) or spec.trained_output is None:
        return
    pruned = g.keep_outputs(model, [spec.trained_output])
    sess = InferenceSession(pruned.SerializeToString(), make_session_options(1), providers=["CPUExecutionProvider"])
    output = sess.run([spec.trained_output], {k: v[:1] for k, v in feeds.items()})[0]
    if output.ndim == 2:
        spec.label_shape = [spec.label_shape[0], int(output.shape[1])]
