"""Hydra + MLflow pipelines around ortflow: convert, add_loss, train, evaluate, export (and main, the chain).

Each stage runs alone (``python -m pipelines <stage> key=value ...``, or ``python -m pipelines.<stage>``) or chained
(``python -m pipelines main``, or ``python -m pipelines.main``). The stages are declared once, in
:mod:`pipelines.stages`; only :mod:`pipelines.tracking` imports MLflow. The core library ``ortflow`` never imports
this package, MLflow or Hydra.

The modules sit in layers, each importing only its own and lower ones (the table is in docs/PIPELINES.md, "Code
layout", checked by tests/test_layering.py): the entry points here, ``orchestration`` (the chain, sweeps),
``stages``, ``execution`` (a stage in its run), ``tracking`` (MLflow), ``modeling``, ``data``, ``base``.
"""
