"""``python -m pipelines.export key=value ...``: the ``export`` stage alone, in its own MLflow run.

Log the deployable ONNX model with MLflow, register a version, promote it with an alias.

The stage itself is pipelines/stages/export.py; its inputs come from ``source.run_id=<an earlier run>`` or
``source.path=<a folder of files>`` (see docs/PIPELINES.md).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from .cli import run_stage
from .config import CONFIG_DIR, register_configs
from .overrides import guarded

register_configs()


@guarded
@hydra.main(config_path=CONFIG_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    return run_stage("export", cfg)


if __name__ == "__main__":
    main()
