"""What a run records: the config as params and YAML, metrics, tags, artifacts; and artifacts read back."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, RunTag
from omegaconf import DictConfig, OmegaConf

from ..base.schema import to_container
from .store import Tracking

MAX_PARAM_LENGTH = 6000


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys; lists stay values (``model.hidden_layer_sizes: [32, 16]``)."""
    out: dict[str, Any] = {}
    if isinstance(value, Mapping):
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}{key}."))
    else:
        out[prefix[:-1]] = value
    return out


def log_config(tracking: Tracking, run_id: str, cfg: DictConfig, folder: Path) -> None:
    """Flattened resolved config as params, the YAML (and Hydra's overrides) as artifacts under ``config/``."""
    resolved = to_container(cfg)
    params = [Param(k, _param_text(v)) for k, v in flatten(resolved).items()]
    for start in range(0, len(params), 100):
        tracking.client.log_batch(run_id, params=params[start:start + 100])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(resolved)))
    overrides = hydra_overrides()
    if overrides is not None:
        (folder / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(overrides)))
        tracking.client.set_tag(run_id, "ortflow.overrides", " ".join(overrides)[:4900] or "(none)")
    tracking.client.log_artifacts(run_id, str(folder), "config")


def hydra_overrides() -> list[str] | None:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return list(HydraConfig.get().overrides.task)


def _param_text(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return text[:MAX_PARAM_LENGTH]


def log_metrics(tracking: Tracking, run_id: str, metrics: Mapping[str, Any], step: int = 0) -> None:
    """Log the finite numbers of ``metrics`` in one batch (None and non-numbers are skipped)."""
    now = int(time.time() * 1000)
    batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if _is_number(v)]
    for start in range(0, len(batch), 1000):
        tracking.client.log_batch(run_id, metrics=batch[start:start + 1000])


def set_tags(tracking: Tracking, run_id: str, tags: Mapping[str, Any]) -> None:
    items = [RunTag(k, str(v)[:4900]) for k, v in tags.items() if v is not None]
    if items:
        tracking.client.log_batch(run_id, tags=items)


def log_artifact(tracking: Tracking, run_id: str, path: str | Path, artifact_path: str | None = None) -> str:
    """Log one file; returns its artifact path inside the run."""
    path = Path(path)
    tracking.client.log_artifact(run_id, str(path), artifact_path)
    return f"{artifact_path}/{path.name}" if artifact_path else path.name


def log_folder(tracking: Tracking, run_id: str, folder: str | Path, artifact_path: str) -> str:
    """Log every file of ``folder`` under ``artifact_path``; returns ``artifact_path``."""
    tracking.client.log_artifacts(run_id, str(folder), artifact_path)
    return artifact_path


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) or (hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0)


def is_finite(value: Any) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def param_differences(params: Mapping[str, str], cfg: DictConfig, keys: Iterable[str] = (),
                      prefixes: tuple[str, ...] = ()) -> list[str]:
    """``"<key>=<value> (source run) but <value> here"`` for each of ``keys`` (and of the keys starting with one
    of ``prefixes``) that both a run's ``params`` and ``cfg`` hold, with other values (compared as logged)."""
    flat = {k: _param_text(v) for k, v in flatten(to_container(cfg)).items()}
    keys = list(keys) + sorted(k for k in flat if k.startswith(prefixes) and k not in keys) if prefixes else list(keys)
    return [f"{key}={params[key]} (source run) but {flat[key]} here" for key in keys
            if key in params and key in flat and flat[key] != params[key]]


def run_params(tracking: Tracking, run_id: str) -> dict[str, str]:
    """The params run ``run_id`` logged (its flattened config)."""
    return dict(tracking.call(tracking.client.get_run, run_id).data.params)


def log_param(tracking: Tracking, run_id: str, key: str, value: Any) -> None:
    tracking.client.log_param(run_id, key, value)


def download_artifacts(artifact_uri: str | None = None, run_id: str | None = None, artifact_path: str | None = None,
                       dst_path: str | Path | None = None, tracking_uri: str | None = None) -> Path:
    """A local copy (under ``dst_path``, else a new temporary folder) of the artifact ``artifact_uri``, or of
    ``artifact_path`` of run ``run_id``, from the current store or ``tracking_uri``; MLflow's error when there is
    none."""
    return Path(mlflow.artifacts.download_artifacts(
        artifact_uri=artifact_uri, run_id=run_id, artifact_path=artifact_path,
        dst_path=None if dst_path is None else str(dst_path), tracking_uri=tracking_uri))
