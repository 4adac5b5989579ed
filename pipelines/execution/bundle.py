"""What the stages hand to each other: named files, each a local path and/or an MLflow artifact URI.

Every stage run logs ``manifest.json`` (all entries known so far, as ``runs:/<run_id>/<path>`` URIs), so a stage
run alone can start from any earlier run (``source.run_id=...``) or from a folder of files (``source.path=...``).

A manifest read from a tracking store is data, not trusted code: only the entries below are read, each must be a
``runs:/<run id>/<path>`` URI naming the file its stage writes (no ``file://``, ``http://``, ``models:/`` or other
scheme, no ``..``), and every entry is data (NumPy arrays without pickles, JSON, ONNX through ortflow's loader):
nothing downloaded is unpickled.
"""

from __future__ import annotations

import atexit
import json
import re
import shutil
import tempfile
from pathlib import Path

import onnx
from omegaconf import DictConfig

from ortflow.graph.editing import load_model, safe_join

from ..base import stages

MANIFEST = "manifest.json"
#: entry name -> the file name stages write it under (also what source.path folders are searched for), and which
#: stage writes each entry (for error messages): both from the stage table (pipelines/base/stages.py)
FILES, PRODUCER = stages.FILES, stages.PRODUCER


class MissingInputError(LookupError):
    """A stage needs an entry no earlier stage (or source) provided."""


class UntrustedManifestError(ValueError):
    """A manifest entry points outside the runs' artifacts (another scheme, ``..``, another file name)."""


_ENTRY_URI = re.compile(r"^runs:/([0-9a-f]{32})/([A-Za-z0-9_./-]+)$")


def checked_uri(name: str, uri: object, origin: str) -> str:
    """``uri`` when it is ``runs:/<run id>/<folder>/<the file entry name's stage writes>``; else raise
    :class:`UntrustedManifestError` naming the entry."""
    match = _ENTRY_URI.match(uri) if isinstance(uri, str) else None
    parts = match.group(2).split("/") if match else []
    if not match or any(p in ("", ".", "..") for p in parts) or parts[-1] != FILES[name]:
        raise UntrustedManifestError(
            f"{origin}: manifest entry {name!r} points at {str(uri)[:200]!r}; an entry must be an artifact of a "
            f"run in the same tracking store, runs:/<run id>/<folder>/{FILES[name]}: nothing was downloaded")
    return uri


class Bundle:
    def __init__(self, entries: dict[str, dict] | None = None, origin: str = "the chain"):
        self.entries: dict[str, dict] = {k: dict(v) for k, v in (entries or {}).items()}
        self.origin = origin
        self._cache: Path | None = None

    def cache(self) -> Path:
        """The temporary folder of this bundle's downloads, removed when the process exits (what was read from it
        may still be in use after the bundle is gone)."""
        if self._cache is None:
            self._cache = Path(tempfile.mkdtemp(prefix="ortflow-inputs-"))
            atexit.register(shutil.rmtree, self._cache, True)
        return self._cache

    # ------------------------------------------------------------------ building
    def add(self, name: str, local: str | Path, run_id: str | None = None, artifact_path: str | None = None) -> None:
        entry = {"local": str(Path(local).resolve())}
        if run_id and artifact_path:
            entry["uri"] = f"runs:/{run_id}/{artifact_path}"
        self.entries[name] = entry

    def to_json(self) -> str:
        return json.dumps({k: {"uri": v["uri"]} if "uri" in v else v for k, v in self.entries.items()}, indent=2)

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / MANIFEST
        path.write_text(self.to_json())
        return path

    # ------------------------------------------------------------------ reading
    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def path(self, name: str, stage: str) -> Path:
        """A local copy of entry ``name`` (downloaded once from the tracking store when needed)."""
        entry = self.entries.get(name)
        if entry is None:
            raise MissingInputError(
                f"stage {stage!r} needs {name!r} (written by the {PRODUCER.get(name, '?')!r} stage), which "
                f"{self.origin} does not provide: pass source.run_id=<a run of {PRODUCER.get(name, 'that stage')} "
                f"or later> or source.path=<a folder holding {FILES.get(name, name)}>"
            )
        local = entry.get("local")
        if local and Path(local).exists():
            return Path(local)
        if "uri" not in entry:
            raise MissingInputError(f"{name!r}: {local} does not exist")
        from ..tracking import download_artifacts

        target = safe_join(self.cache(), name)  # names come from a run's manifest: never outside the cache
        target.mkdir(exist_ok=True)
        downloaded = download_artifacts(artifact_uri=entry["uri"], dst_path=target)
        entry["local"] = str(downloaded)
        return downloaded

    def load_onnx(self, name: str, stage: str) -> onnx.ModelProto:
        """Entry ``name`` as an ONNX model, through ortflow's loader (external data must stay in its folder)."""
        return load_model(self.path(name, stage))

    def read_json(self, name: str, stage: str) -> dict:
        return json.loads(self.path(name, stage).read_text())

    # ------------------------------------------------------------------ sources
    @classmethod
    def from_run(cls, run_id: str) -> Bundle:
        from ..tracking import download_artifacts

        bundle = cls({}, origin=f"run {run_id}")
        try:
            local = download_artifacts(run_id=run_id, artifact_path=MANIFEST, dst_path=bundle.cache())
        except Exception as exc:  # noqa: BLE001 - MlflowException or OSError, same message
            raise MissingInputError(
                f"source.run_id={run_id}: the run has no {MANIFEST} artifact (is it a run of an ortflow stage?): {exc}"
            ) from exc
        entries = json.loads(Path(local).read_text())
        # only the entries the stages know (a name from a manifest also becomes a folder name, see path), each
        # checked before anything is downloaded; local paths of another machine are ignored
        bundle.entries = {k: {"uri": checked_uri(k, v.get("uri") if isinstance(v, dict) else v, bundle.origin)}
                          for k, v in entries.items() if k in FILES and not (isinstance(v, dict) and "uri" not in v)}
        return bundle

    @classmethod
    def from_path(cls, path: str | Path) -> Bundle:
        path = Path(path).expanduser().resolve()
        if not path.exists():
            raise FileNotFoundError(f"source.path={str(path)!r} does not exist")
        if path.is_file():
            if path.name == MANIFEST:
                return cls(_checked_entries(json.loads(path.read_text()), str(path)), origin=str(path))
            if path.suffix == ".onnx":
                name = next((k for k, f in FILES.items() if f == path.name), "model")
                return cls({name: {"local": str(path)}}, origin=str(path))
            raise ValueError(f"source.path={str(path)!r}: give a folder, a {MANIFEST} or an .onnx file")
        entries = {name: {"local": str(path / f)} for name, f in FILES.items() if (path / f).exists()}
        if (path / MANIFEST).exists():
            saved = _checked_entries(json.loads((path / MANIFEST).read_text()), str(path / MANIFEST))
            entries = {**saved, **entries}
        if not entries:
            raise MissingInputError(f"source.path={str(path)!r} holds none of {sorted(FILES.values())}")
        return cls(entries, origin=str(path))

    @classmethod
    def from_source(cls, source: DictConfig) -> Bundle:
        if source.run_id and source.path:
            raise ValueError("give source.run_id or source.path, not both")
        if source.run_id:
            return cls.from_run(str(source.run_id))
        if source.path:
            return cls.from_path(str(source.path))
        return cls(origin="no source (source.run_id and source.path are unset)")


def _checked_entries(entries: dict, origin: str) -> dict[str, dict]:
    """The known entries of a local manifest: local paths as they are (the user picked the folder), URIs checked."""
    checked = {}
    for name, entry in entries.items():
        if name not in FILES or not isinstance(entry, dict):
            continue
        checked[name] = {k: v for k, v in entry.items() if k == "local"}
        if "uri" in entry:
            checked[name]["uri"] = checked_uri(name, entry["uri"], origin)
    return checked
