"""Hydra + MLflow pipelines around ortflow: convert, add_loss, train, evaluate, export (and main, the chain).

Each stage runs alone (``python -m pipelines <stage> key=value ...``, or ``python -m pipelines.<stage>``) or chained
(``python -m pipelines main``, or ``python -m pipelines.main``). The stages are declared once, in
:mod:`pipelines.stages`; only :mod:`pipelines.tracking` imports MLflow. The core library ``ortflow`` never imports
this package, MLflow or Hydra.
"""
