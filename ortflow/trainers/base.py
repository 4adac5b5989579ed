"""``BaseTrainer``: the scikit-learn estimator, its epoch loop and its one batch loop, shared by every trainer.

A subclass owns the onnxruntime side and implements the hooks below; the base class validates inputs, splits a
validation set, shuffles, runs epochs and callbacks, runs the batches and detects divergence. It checkpoints
through :class:`ortflow.trainers.checkpoint.CheckpointMixin` and predicts through :class:`ortflow.trainers.prediction.PredictionMixin`;
what it feeds and reads is :mod:`ortflow.data.graph_spec`'s, a stream's chunks are cut into whole batches by
:mod:`ortflow.data.rechunk`. The runtime a subclass builds is stored in ``_rt_*`` attributes, left out of a pickle.

Parameters are declared once in :mod:`ortflow.trainers.parameters` (``parameters`` of each subclass, from which its
``__init__`` is made) and checked in ``fit``. What a subclass implements:

- ``_graph_spec(model) -> GraphSpec``: the feeds and outputs of ``model`` (already loaded and checked);
- ``_build_runtime(model, spec, rate)``: the runtime of a fresh fit, ``rate`` the optimizer: it sets ``_rt_runtime``,
  a :class:`~ortflow.engines.training_runtime.TrainingRuntime` (rows of a unit, learning rate, batches, step and update,
  validation loss, weights, optimizer state, graphs), and ``_rt_rate``, the optimizer whose schedule gives each
  epoch's rate; the one batch loop (:meth:`BaseTrainer._run_batches`) and every state method go through it;
- ``_loss_object()``: the :class:`ortflow.objectives.losses.BaseLearningLoss` trained (for :meth:`BaseTrainer.losses`);
- ``_training_problem(model, weights, rate)``: what it trains as a :class:`~ortflow.trainers.problem.TrainingProblem`
  (default: a prediction graph trained with a loss family), ``_state_settings(state)`` what ``from_state`` makes;
- optionally ``_device_pass(data, order, count)``: a :class:`~ortflow.engines.training_runtime.DevicePass` over the unit
  kept on the device (full training's), run by the same batch loop;
- ``_state_file``, the file the weights and optimizer state are saved in (:func:`ortflow.trainers.checkpoint.save_state`),
  or ``_save_runtime_state(folder)`` / ``_load_runtime_state(folder)`` for a runtime that saves its own.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from itertools import islice

import numpy as np
import onnx
from sklearn.base import BaseEstimator, clone
from sklearn.utils import check_random_state

from ..graph import editing as g
from .callbacks import Callback, EarlyStopping, ProgressBar, TimeLimit
from .checkpoint import CheckpointMixin, Progress, load_state, save_state
from ..convert.sklearn import ESTIMATOR_METADATA
from ..objectives.estimator_loss import own_loss, own_penalty
from ..exceptions import ConvergenceError
from ..runtime.frozen_prefix import FrozenPrefix
from ..data.graph_spec import (GraphSpec, TrainData, encoded_targets, fitted_names, fitted_width, matrix_width,
                               n_features_of, prediction_spec, resolve_symbolic_width, trained_classes)
from ..optimizers.learning_rates import BaseLearningRate, LearningRateSGD
from ..convert.ml_op_rewrites import make_trainable
from .parameters import check_parameters
from .prediction import PredictionMixin
from ..runtime.guards import check_not_fitting, exclusive_fit
from ..runtime.placement import Placement
from ..data.prefetch import Prefetcher
from .problem import TrainingProblem, fitted, prediction_problem, trainer_settings
from ..data.rechunk import whole_batches
from ..registry import select
from ..runtime.sessions import THREADS_WORK_THRESHOLD, SessionOptions, threads_for_work, training_session_options
from ..data.shuffle import epoch_order
from ..engines.training_runtime import DevicePass
from ..data.sources import is_source, replays_order, source_identity
from ..runtime.validation import batch_rows, check_targets, check_weights_to_train

__all__ = ["BaseTrainer", "GraphSpec", "TrainData", "prediction_spec"]  # the types stay importable from here

logger = logging.getLogger("ortflow")



class BaseTrainer(CheckpointMixin, PredictionMixin, BaseEstimator):
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

        ``X`` may also be a data source (:mod:`ortflow.data.sources`: a Parquet file or folder, Arrow data, memory-mapped
        arrays, a ``DataLoader``), read chunk by chunk with the next chunks prepared on a background thread; ``y``
        is then None (the source holds the target) and ``validation_data`` may be another source.
        """
        self._streamed_fit = is_source(X)
        self._check_portable_shuffle()
        if self._streamed_fit:
            return self._fit_source(X, y, sample_weight, validation_data, resume_from)
        model, spec, feeds, names, train_model, prefix = self._graph_and_feeds(X)
        data, val = self._prepare_data(spec, prefix, feeds, names, y, sample_weight, validation_data)
        given, self.batch_size = self.batch_size, batch_rows(self.batch_size, data.n_samples)  # this fit's batches
        try:
            rng = check_random_state(self.random_state)
            if val is None and self.validation_fraction is not None:
                data, val = self._split_validation(data, rng)
            rng, max_iter = self._begin(model, spec, train_model, feeds, names, rng, resume_from)

            def chunks(epoch):
                yield data, self._epoch_order(rng, data.n_samples, epoch)

            self._rt_prefix, self._rng = prefix, rng
            self._train_epochs(range(len(self.history_), max_iter), chunks, lambda epoch: epoch * data.n_samples,
                               val, rng)
        finally:
            self.batch_size = given  # the parameter as set (get_params, clone)
        self._samples_seen = len(self.history_) * data.n_samples
        return self

    def _fit_source(self, source, y, sample_weight, validation_data, resume_from):
        """``fit`` on a :class:`ortflow.data.sources.BatchSource`: the graph is set up from its first chunk, each epoch
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

        def prepare(X, y_part, w_part) -> TrainData:
            f, _ = spec.inputs.feeds(X, matrix_width(spec, feeds), names)
            return self._prepare_data(spec, prefix, f, names, y_part, w_part, None)[0]

        def count(rows: int) -> None:
            seen[0] += rows

        def convert(chunk_source, order_rng, counted: bool, skip: int = 0):
            return whole_batches(chunk_source, order_rng, self.batch_size, prepare, skip, count if counted else None)

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
        self._check_portable_shuffle()
        if first:
            model, spec, feeds, names, train_model, prefix = self._graph_and_feeds(X)
        else:
            spec = self._spec
            feeds, names = spec.inputs.feeds(X, fitted_width(self), fitted_names(self))
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
            yield data, self._epoch_order(rng, data.n_samples, epoch)

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
        spec.classes = trained_classes(model, spec)
        feeds, names = spec.inputs.feeds(X)
        resolve_symbolic_width(model, spec, feeds)
        output = self._trained_output_name(spec)
        weights = self._check_weights(model, g.keep_outputs(model, [output]), output)
        train_model, prefix = FrozenPrefix.split(model, weights, spec.inputs.names, [output], feeds)
        return model, spec, feeds, names, train_model, prefix

    def _split_again(self, feeds) -> FrozenPrefix | None:
        """The frozen prefix of the fitted graph (an unpickled estimator holds no session)."""
        return FrozenPrefix.split(self._model, self.weights_to_train_, self._spec.inputs.names,
                                  [self._trained_output_name(self._spec)], feeds)[1]

    def _start(self, model, spec, train_model) -> None:
        """A fresh training: the placement resolved, the runtime built on the trainable part, an empty history."""
        self._rt_placement = None
        self._spec = spec
        self._model = model
        self._train_model = train_model
        self._fit_settings = self._settings()
        self.n_threads_ = self._threads(train_model)
        self._rt_batches = {}
        self._build_runtime(train_model, spec, self._learning_rate())
        self.history_ = []
        self._append(None)

    def _fitted_inputs(self, spec, feeds, names) -> None:
        """``n_features_in_`` and ``feature_names_in_`` of the data fit saw."""
        self.n_features_in_ = n_features_of(spec, feeds)
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
                    progress = Progress(epoch, streamed, rng.get_state(), seen)
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
            self._release_training_data()
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
        """``(loss, row count)`` of every batch over ``chunks``, and whether every batch ran: the batch loop stops at
        the first non-finite loss. A streamed epoch's ``progress`` (resumed or new) holds the batches so far and is
        advanced after each chunk, where the ``callbacks``' ``on_chunk_end`` run (weights at a chunk boundary: a
        checkpoint may be written then, nowhere else inside the epoch)."""
        losses, sizes = ([np.empty(0)], [np.empty(0)]) if progress is None else (progress.losses, progress.sizes)
        for data, order in chunks:
            chunk = self._train_rows(data, order, learning_rate)
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
        prefix's outputs when the graph has one, see :mod:`ortflow.runtime.frozen_prefix`)."""
        n_rows = len(next(iter(feeds.values())))
        y, w = check_targets(encoded_targets(spec, y), sample_weight, n_rows, spec.label_shape)
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
            feeds_v, _ = spec.inputs.feeds(validation_data[0], matrix_width(spec, feeds), names)
            yv, _ = check_targets(encoded_targets(spec, validation_data[1]), None, len(next(iter(feeds_v.values()))),
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
        if self.max_time is not None:
            callbacks.append(TimeLimit(self.max_time))
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

    def _train_rows(self, data: TrainData, order, learning_rate: float) -> np.ndarray:
        """Train the rows of one unit ``(data, order)`` (``order``: indices into ``data``; None: every row as
        stored) in batches of ``batch_size`` through the runtime (:meth:`_run_batches`, the one batch loop). The
        loss of every batch, ending at the first non-finite one, whose step is not applied. A trainer that keeps
        the data on the device trains the unit there (:meth:`_device_pass`), with the same result: the pass's
        steps are all applied, the losses read at its end, and a non-finite one rolls the state back to the pass's
        start and replays the steps before it."""
        runtime = self._rt_runtime
        runtime.set_learning_rate(learning_rate)
        n_rows = self._unit_rows(data, order)
        count = -(-n_rows // self.batch_size)
        on_device = self._device_pass(data, order, count)
        if on_device is None:
            return self._run_batches(self._batches(n_rows, order), n_rows, runtime.row_arrays(data),
                                     self._rt_batches, runtime.new_batch, runtime.step, runtime.apply)
        self._run_batches(self._batches(n_rows, None), n_rows, (), on_device.batches, on_device.new_batch,
                          on_device.step, None, on_device.feed)
        losses = on_device.losses(count)
        bad = np.flatnonzero(~np.isfinite(losses))
        if len(bad) == 0:
            return losses
        on_device.rollback()
        self._run_batches(islice(self._batches(n_rows, None), int(bad[0])), n_rows, (), on_device.batches,
                          on_device.new_batch, on_device.step, None, on_device.feed)
        return losses[: bad[0] + 1]

    def _run_batches(self, batches, n_rows: int, arrays, built: dict, new_batch, step, apply, feed=None) -> np.ndarray:
        """The batch loop: per row selection of ``batches`` (slices or indices of rows of ``arrays``), the batch of
        its size (``built``, else ``new_batch(n, arrays)``) gets its rows (copied into its ``inputs``, or
        ``feed(batch, rows, i)`` where given), then ``step(batch)``: its loss checked and ``apply(batch)`` added
        (the update applied only after a finite loss); ``apply=None``: the steps apply themselves and return no
        loss (a :class:`~ortflow.engines.training_runtime.DevicePass`). The losses, ending at the first non-finite one."""
        copy, take = np.copyto, np.take
        losses = np.empty(-(-n_rows // self.batch_size), dtype=np.float64)
        for i, rows in enumerate(batches):
            is_slice = rows.__class__ is slice
            n = (min(rows.stop, n_rows) - rows.start) if is_slice else len(rows)
            entry = built.get(n)
            if entry is None:
                batch = new_batch(n, arrays)
                on_host = feed is None and all(b.array is not None for b in batch.inputs)
                entry = built[n] = (batch, [b.array for b in batch.inputs] if on_host else None)
            batch, targets = entry
            if targets is None:
                if feed is not None:  # rows on the device: bound by address
                    feed(batch, rows, i)
                else:  # device buffers: gathered on the host, then copied over
                    for buffer, array in zip(batch.inputs, arrays):
                        buffer.gather(array, rows)
            elif is_slice:
                for target, array in zip(targets, arrays):
                    copy(target, array[rows])
            else:
                for target, array in zip(targets, arrays):
                    take(array, rows, axis=0, out=target)
            batch.rows = rows
            loss = step(batch)
            if apply is None:
                continue
            if loss - loss != 0.0:  # NaN or infinite: the step is not applied
                losses[i] = loss
                return losses[: i + 1]
            losses[i] = loss + apply(batch)
        return losses

    def _device_pass(self, data: TrainData, order, count: int) -> DevicePass | None:
        """The pass of ``count`` steps over the unit ``(data, order)`` kept on the device, or None where the
        trainer keeps no data there (the default) or not this unit."""
        return None

    def _release_training_data(self) -> None:
        """Drop what the trainer keeps of the training data between units (its device copy), when training ends."""
        self._rt_runtime.release()

    def _epoch_learning_rate(self, samples_seen: int) -> float:
        """The rate of the coming epoch: the optimizer's schedule after ``samples_seen`` samples."""
        return self._rt_rate.value_at(samples_seen)

    def _prediction_graph(self) -> onnx.ModelProto:
        """The prediction graph, weights not yet replaced."""
        return g.keep_outputs(self._model, self._spec.prediction_outputs)

    def _validation_loss(self, data: TrainData) -> float:
        return self._rt_runtime.loss(data)

    def _check_portable_shuffle(self) -> None:
        """``shuffle='portable'`` needs an int ``random_state`` and rows held in memory."""
        if self.shuffle != "portable":
            return
        if not isinstance(self.random_state, (int, np.integer)):
            raise ValueError(f"shuffle='portable' draws each epoch's order from an int seed: random_state="
                             f"{self.random_state!r} must be an int")
        if getattr(self, "_streamed_fit", False):
            raise ValueError("shuffle='portable' orders rows held in memory; a source shuffles its own chunks "
                             "(shuffle=True)")

    def _epoch_order(self, rng, n_samples: int, epoch: int):
        """The rows' order in ``epoch`` (the epochs trained before it): None unshuffled, ``rng``'s permutation, or
        with ``shuffle='portable'`` :func:`ortflow.data.shuffle.epoch_order` of ``random_state`` (a training package's)."""
        if not self.shuffle:
            return None
        if self.shuffle == "portable":
            return epoch_order(n_samples, int(self.random_state), epoch)
        return rng.permutation(n_samples)

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
            if batch:  # the losses seen are recorded (as onnxcustom does): the epoch's batches before the bad one
                self.train_losses_ = [*(r["train_loss"] for r in self.history_), float(np.mean(losses[:batch]))]
            raise ConvergenceError(message, epoch=epoch + 1, batch=batch + 1)
        warnings.warn(message + "; the weights of the last finite epoch are kept", RuntimeWarning, stacklevel=3)
        self.set_state(last_good)
        self.stop_training_ = True

    # --- what the trainer trains, as one value -------------------------------------------------------------
    def training_problem(self) -> TrainingProblem:
        """What this trainer trains, fitted or not, as one :class:`ortflow.trainers.problem.TrainingProblem`: its loss and
        prediction graphs, the inputs by role, the trained weights, the optimizer, the state table (current
        weights and optimizer slots), the progress and the batch size. The training package's writer reads a
        trainer through it."""
        model = make_trainable(g.load_model(self.model_onnx), self.weights_to_train)
        was_fitted = hasattr(self, "history_")
        problem = self._training_problem(model, list(self.weights_to_train_) if was_fitted else None,
                                         self._learning_rate())
        names = getattr(self, "feature_names_in_", None)
        problem.feature_names = None if names is None else [str(n) for n in names]
        if was_fitted:
            fitted(problem, self.get_state(), self._exported_optimizer_state(problem.rate), len(self.history_),
                   getattr(self, "_samples_seen", 0))
        return problem

    def _training_problem(self, model: onnx.ModelProto, weights: list[str] | None,
                          rate: BaseLearningRate) -> TrainingProblem:
        """The hook of :meth:`training_problem`: the problem of ``model`` (weights at their start), ``weights``
        the trained ones of a fitted trainer (None: from ``weights_to_train``)."""
        raise NotImplementedError

    def _exported_optimizer_state(self, rate: BaseLearningRate) -> dict[str, np.ndarray] | None:
        """The optimizer state :meth:`training_problem` carries (None: one ortflow cannot read)."""
        return self.get_optimizer_state()

    @classmethod
    def from_state(cls, state, **params) -> BaseTrainer:
        """An unfitted trainer of this class continuing a training package's ``state`` (a
        :class:`ortflow.package.TrainingState`): its weights, optimizer, schedule and batch size (``params``
        overrides or adds settings: ``max_iter``...). Its ``fit`` starts new optimizer slots (Adam's moments at
        zero, ``step`` from 1); the weights continue from the state's."""
        model, settings = cls._state_settings(state)
        settings.update(params)
        return cls(model, **settings)

    @classmethod
    def _state_settings(cls, state) -> tuple[onnx.ModelProto, dict]:
        """The graph and the settings :meth:`from_state` makes its trainer of (default: a prediction graph, the
        package's with the state's weights, trained with the loss the package's loss graph records)."""
        _, settings = trainer_settings(state)
        return state.get_trained_onnx(), settings

    def set_params(self, **params):
        """scikit-learn's ``set_params``, refused (:class:`~ortflow.exceptions.ConcurrentFitError`) while the
        estimator fits."""
        check_not_fitting(self, f"set_params({', '.join(sorted(params))})")
        return super().set_params(**params)

    # --- state ---------------------------------------------------------------------------------------------
    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Set the trained weights from a dict name -> array (as returned by :meth:`get_state`)."""
        self._check_fitted()
        unknown = sorted(set(state) - set(self.weights_to_train_))
        if unknown:
            raise KeyError(f"set_state: {unknown} are not trained weights; trained: {self.weights_to_train_}")
        self._set_weights({k: np.asarray(v, dtype=np.float32) for k, v in state.items()})
        self._predict_sess = None

    def get_optimizer_state(self) -> dict[str, np.ndarray]:
        """The optimizer's state as numpy arrays, in one layout for every trainer: ``<slot>:<weight>`` (Adam's
        ``m:coef`` and ``v:coef``, Nesterov's ``velocity:coef``) and ``step``, the number of updates."""
        self._check_fitted()
        return self._optimizer_state()

    def get_state(self) -> dict[str, np.ndarray]:
        """Trained weights by name (copies)."""
        self._check_fitted()
        return self._rt_runtime.get_weights()

    def _set_weights(self, state: dict[str, np.ndarray]) -> None:
        self._rt_runtime.set_weights(state)

    def _optimizer_state(self) -> dict[str, np.ndarray]:
        return self._rt_runtime.get_optimizer_state()

    def _set_optimizer_state(self, state: dict[str, np.ndarray]) -> None:
        self._rt_runtime.set_optimizer_state(state)

    def _graphs(self) -> dict:
        return self._rt_runtime.graphs()

    def _save_runtime_state(self, folder: str) -> None:
        save_state(folder, self._state_file, self.get_state(), self._optimizer_state())

    def _load_runtime_state(self, folder: str) -> None:
        weights, state = load_state(folder, self._state_file, f"{type(self).__name__} state")
        self._set_weights(weights)
        self._set_optimizer_state(state)

    def get_trained_onnx(self, model: g.ModelLike | None = None) -> onnx.ModelProto:
        """The prediction graph with the trained weights, loadable by a plain InferenceSession; with ``model`` (a
        graph, bytes or a path: onnxcustom's argument), that graph with the trained weights in place of its
        initializers of the same names (a KeyError names a trained weight it lacks)."""
        self._check_fitted()
        if model is not None:
            return g.replace_initializers(g.load_model(model), self.get_state())
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

    # --- helpers for subclasses ----------------------------------------------------------------------------
    def _session_options(self) -> SessionOptions:
        """The training sessions' options: ``n_threads_`` intra-op threads, spinning as :meth:`_spinning` says."""
        return training_session_options(getattr(self, "n_threads_", self.n_threads), self._spinning())

    def _placement(self) -> Placement:
        """``device`` and ``precision`` (of CUDA's float32 products; absent in an older pickle: fp32) resolved once
        per fit into the :class:`~ortflow.runtime.placement.Placement` every session of the trainer gets."""
        placement = self.__dict__.get("_rt_placement")
        if placement is None:
            placement = self._rt_placement = Placement.of(self.device, getattr(self, "precision", "fp32"))
        return placement

    def _spinning(self) -> bool:
        """``spinning``, or, when None, spinning except in a streamed fit (where the reader thread needs a core)."""
        return self.spinning if self.spinning is not None else not getattr(self, "_streamed_fit", False)

    def _threads(self, model: onnx.ModelProto) -> int:
        """``n_threads`` when set, else the count :func:`ortflow.runtime.sessions.threads_for_work` picks for a batch of
        ``batch_size`` rows through ``model``'s float weights."""
        if self.n_threads is not None:
            return int(self.n_threads)
        return threads_for_work(self.batch_size, g.float_weight_count(model), self._placement().device,
                                self._threads_threshold())

    def _threads_threshold(self) -> int:
        """The work under which one thread beats all cores for this trainer (:mod:`ortflow.runtime.sessions`)."""
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
            self._rt_batches = {}
            self._build_runtime(self._train_model, self._spec, self._learning_rate())
            self._set_weights(weights)


class _StreamedValidation:
    """Validation data read from a source at each validation (never held whole)."""

    def __init__(self, chunks):
        self.chunks = chunks


#: what a source that does not replay its epochs (:func:`ortflow.data.sources.replays_order`) is, in the errors
_NOT_REPLAYED = "whose epochs come in an order drawn from torch's random state (a DataLoader with shuffle=True)"


class PredictionGraphTrainer(BaseTrainer):
    """A trainer of a prediction graph that adds its loss and penalty itself (forward-backward and torch training):
    the graph's output ``output_name`` trained on the model's own loss (``learning_loss`` None) or the one named,
    with ``learning_penalty`` (``ortflow.objectives.estimator_loss.own_loss``/``own_penalty``)."""

    def _graph_spec(self, model: onnx.ModelProto) -> GraphSpec:
        return prediction_spec(model, self.output_name, self.weight_name)

    def _loss_object(self):
        return own_loss(self._model, self.learning_loss)

    def _penalty_object(self):
        return own_penalty(self._model, self.learning_loss, self.learning_penalty)

    def _training_problem(self, model: onnx.ModelProto, weights: list[str] | None,
                          rate: BaseLearningRate) -> TrainingProblem:
        spec = prediction_spec(model, self.output_name, self.weight_name)
        return prediction_problem(type(self).__name__, model, spec.trained_output, spec.weight_name,
                                  own_loss(model, self.learning_loss),
                                  own_penalty(model, self.learning_loss, self.learning_penalty),
                                  self.learning_penalty, weights, self.weights_to_train, rate, self.batch_size)

    def _trained_graph(self, model: onnx.ModelProto, spec: GraphSpec) -> onnx.ModelProto:
        """The graph down to the trained output, ``weights_to_train_`` checked on it."""
        output = spec.trained_output
        train_graph = g.keep_outputs(model, [output])
        self.weights_to_train_ = self._check_weights(model, train_graph, output)
        return train_graph

