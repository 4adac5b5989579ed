"""``python -m pipelines.evaluate key=value ...``: the ``evaluate`` stage alone, in its own MLflow run.

Test metrics of the trained ONNX model, run by a plain onnxruntime InferenceSession.

The stage itself is pipelines/stages/evaluate.py; its inputs come from ``source.run_id=<an earlier run>`` or
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
    return run_stage("evaluate", cfg)


if __name__ == "__main__":
    main()
