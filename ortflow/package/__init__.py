"""Training packages: what a runtime without Python needs to train an ortflow model (docs/TRAINING_OUTSIDE_PYTHON.md);
the reader and reference loop (:mod:`~ortflow.package.reader`) and the writer (:mod:`~ortflow.package.writer`)."""

from .reader import *  # noqa: F401,F403
from .reader import (FLAT_STATE, FLAT_STEP_FILE, FLAT_UPDATED, FORMAT, FORMAT_VERSION, IR_VERSION, LOSS_FILE,  # noqa
                     MANIFEST, PREDICT_FILE, STATE_FILE, STATE_FORMAT, STATE_MAGIC, STEP_FILE, UNROLLED_FILE,
                     UNROLLED_LOSSES, _targets)
from .writer import MAX_UNROLLED, UNROLLED_TARGET_US, export_training_package, unrolled_bound  # noqa: F401
