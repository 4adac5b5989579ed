"""Where relative paths of the command line resolve: the directory the command was started from."""

from __future__ import annotations

from pathlib import Path


def original_cwd() -> Path:
    """The directory the command was started from (Hydra may have changed the cwd when chdir is on)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        from hydra.utils import get_original_cwd

        return Path(get_original_cwd())
    return Path.cwd()


def user_path(path: str | Path) -> Path:
    """``path`` with ``~`` expanded, relative to :func:`original_cwd` unless absolute."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else original_cwd() / path
