"""``python -m pipelines.main key=value ...``: the whole chain, one parent MLflow run and a nested run per stage.

    python -m pipelines.main                                   # the defaults, on ./mlflow.db
    python -m pipelines.main experiment=breast_cancer_logistic
    python -m pipelines.main trainer=fwbw trainer.optimizer=nesterov trainer.max_iter=50
    python -m pipelines.main -m trainer.learning_rate=0.001,0.01 hydra/launcher=joblib hydra.launcher.n_jobs=2
    python -m pipelines.main -m hparams_search=optuna

Returns ``cfg.optimized_metric`` to Hydra (what an Optuna sweep optimizes). The chain is pipelines/chain.py.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from .cli import run_main
from .config import CONFIG_DIR, register_configs
from .overrides import guarded

register_configs()


@guarded
@hydra.main(config_path=CONFIG_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    return run_main(cfg)


if __name__ == "__main__":
    main()
