"""Hydra launcher ``hydra/launcher=ray``: each job of a ``-m`` sweep as a Ray task (see launcher.py)."""
