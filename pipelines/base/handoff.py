"""The names one process uses to hand a run id to another: files in Hydra's output folders and environment
variables (written by the entry points and the sweep callback, read by the runner and by ``pipelines.tracking``)."""

from __future__ import annotations

#: file in the sweep directory holding the sweep run's id; environment variable with the same id
SWEEP_RUN_FILE = ".mlflow_sweep_run_id"
SWEEP_RUN_ENV = "ORTFLOW_SWEEP_RUN_ID"
#: file in a job's output directory holding the id of the run the job created
JOB_RUN_FILE = ".mlflow_run_id"
#: mlflow run's run, when the pipelines log into an experiment of their own (see :mod:`pipelines.mlproject`)
OUTER_RUN_ENV = "ORTFLOW_MLFLOW_RUN_ID"
