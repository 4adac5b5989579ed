"""The chain of stages (``chain``, checked first by ``precheck``) and the sweeps: the Hydra callback grouping a
``-m`` sweep under one MLflow run (``sweep_callback``) and the shared Optuna study (``study``)."""
