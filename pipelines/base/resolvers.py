"""What Hydra needs before it composes a config: the schema in its ConfigStore and the resolvers the YAML files
use (a table's file stem, and the ``--help`` text: the stages and the keys each app reads)."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from .errors import CLOSE_KEYS
from .schema import Config, close_keys, file_problem, file_stem, schema_keys
from . import stages as stage_table
from .stages import names as stage_names


#: the app whose ``--help`` is shown: ``main`` or a stage (set by :func:`pipelines.cli.app`)
HELP_APP = {"name": "main"}


#: what every stage reads besides its own keys
COMMON_KEYS = ("source", "mlflow", "seed", "debug")


def app_keys() -> str:
    """The keys the app of ``--help`` reads (the ``ortflow.app_keys`` resolver): a stage's own (its ``reads`` in
    the stage table), the chain's every group; each group with its keys."""
    name = HELP_APP["name"]
    if name in stage_names():
        own, title = stage_table.stage(name).reads, f"Keys of stage {name} (python -m pipelines.{name})"
    else:
        own, title = ("data", "model", "loss", "penalty", "trainer", "promotion", "stages", "optimized_metric"), \
            "Keys of the chain (python -m pipelines.main)"
    keys = schema_keys()
    lines = [f"{title}; set any with key=value (--cfg job prints their values):"]
    for entry in (*own, *COMMON_KEYS):
        inside = [k[len(entry) + 1:] for k in keys if k.startswith(f"{entry}.")]
        lines.append(f"    {entry}: {', '.join(inside)}" if inside else f"    {entry}")
    return "\n".join(lines)


def stage_listing() -> str:
    """The stages for ``--help`` (the ``ortflow.stages`` resolver): their order, then one line each."""
    return " -> ".join(stage_names()) + "".join(f"\n    {s.name:<10} {s.summary}" for s in stage_table.TABLE)


def register_configs() -> None:
    """Store the schema under the name ``conf/config.yaml`` lists first in its defaults; register the resolvers
    the YAML files use."""
    ConfigStore.instance().store(name="ortflow_config", node=Config)
    CLOSE_KEYS["find"] = lambda key: close_keys(key, schema_keys())  # the 'did you mean' of a refused key
    if not OmegaConf.has_resolver("ortflow.stem"):
        OmegaConf.register_new_resolver("ortflow.stem", file_stem)
    if not OmegaConf.has_resolver("ortflow.problem"):  # a table's default registered-model name
        OmegaConf.register_new_resolver("ortflow.problem", file_problem)
    if not OmegaConf.has_resolver("ortflow.stages"):  # the --help text (conf/hydra/help/ortflow.yaml)
        OmegaConf.register_new_resolver("ortflow.stages", stage_listing)
    if not OmegaConf.has_resolver("ortflow.app_keys"):
        OmegaConf.register_new_resolver("ortflow.app_keys", app_keys)
