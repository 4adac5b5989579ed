"""Hydra + MLflow pipelines around ortflow: convert, add_loss, train, evaluate, export (and main, the chain).

Each stage runs alone (``python -m pipelines.<stage> key=value ...``) or chained (``python -m pipelines.main``).
The core library ``ortflow`` never imports this package, MLflow or Hydra.
"""
