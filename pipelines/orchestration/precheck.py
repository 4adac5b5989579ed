"""Checks of the training settings against the data and the graph, before the chain's first stage runs.

``trainer.batch_size`` larger than the training rows is said (the trainer shrinks the batch to the rows, as
scikit-learn does); a ``trainer.weights_to_train`` naming no initializer would fail in ``train``, after
``convert`` and ``add_loss`` had run and logged; ``model=onnx``'s graph (its input
against the data, its output, a gradient rule for every node) would fail in ``convert``. :func:`check_training_settings`
builds what those stages would (the split, and the graph from a scikit-learn fit of one iteration when
``weights_to_train`` is set) and applies ortflow's own checks (``ortflow.runtime.validation``) to them.
"""

from __future__ import annotations

from omegaconf import DictConfig

from ortflow.runtime.validation import check_weights_to_train

from ..base.schema import ConfigError


def check_training_settings(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` naming the key when the chain's train stage would refuse its settings.

    Only for a chain that runs ``convert`` and ``train`` (a stage run alone checks its own inputs at once).
    """
    stages = [str(s) for s in cfg.stages]
    own = str(cfg.model.name) == "onnx"
    if "convert" not in stages or ("train" not in stages and not own):
        return
    from ..data.datasets import make_split

    split = make_split(cfg.data, preprocess=cfg.get("preprocess"))
    if split.is_table:  # an all-empty column would stop convert's graph: named before any run
        from ..stages.convert import check_no_empty_column

        check_no_empty_column(split, {str(k): str(v) for k, v in (cfg.preprocess.get("columns") or {}).items()})
    if own:  # model=onnx: the graph loads, fits the data and has a gradient rule for every node (all named at once)
        from ..stages.convert import own_graph

        graph = own_graph(cfg, split)
        if "train" not in stages:
            return
    rows, batch = len(split.y_train), int(cfg.trainer.batch_size)
    if batch > rows:  # as scikit-learn does: the trainer shrinks the batch to the rows
        print(f"ortflow: trainer.batch_size={batch} is larger than the {rows} training rows of data={cfg.data.name}: "
              f"each epoch trains them in one batch of {rows}")
    if not cfg.trainer.weights_to_train:
        return
    from ..stages.add_loss import with_loss
    from ..stages.convert import fitted_estimator, prediction_graph

    if not own:
        graph = prediction_graph(cfg, fitted_estimator(cfg, split, max_iter=1), split)
    if str(cfg.trainer.name) == "full":
        graph = with_loss(cfg, graph)
    try:
        check_weights_to_train(graph, list(cfg.trainer.weights_to_train))
    except ValueError as exc:
        raise ConfigError(f"trainer.{exc} (nothing was run)") from None
