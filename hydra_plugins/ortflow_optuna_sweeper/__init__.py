"""Hydra sweeper ``hydra/sweeper=ortflow_optuna``: Optuna's ask-and-tell over Hydra's launchers (see sweeper.py)."""
