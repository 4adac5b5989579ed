"""Hydra + MLflow pipelines around ortflow: convert, add_loss, train, evaluate, export (and main, the chain).

Each stage runs alone (``python -m pipelines <stage> key=value ...``, or ``python -m pipelines.<stage>``) or chained
(``python -m pipelines main``, or ``python -m pipelines.main``). The stages are declared once, in
:mod:`pipelines.stages`; only :mod:`pipelines.tracking` imports MLflow. The core library ``ortflow`` never imports
this package, MLflow or Hydra.

The modules sit in layers, each importing only its own and lower ones (the table is in docs/PIPELINES.md, "Code
layout", checked by tests/test_layering.py): the entry points here, ``orchestration`` (the chain, sweeps),
``stages``, ``execution`` (a stage in its run), ``tracking`` (MLflow), ``modeling``, ``data``, ``base``.
"""


def _check_ortflow_is_the_package() -> None:
    """Refuse, naming the folder, an ``ortflow`` that the path resolves to a folder without ``__init__.py`` (a
    namespace package): the clone of the repository, named ``ortflow``, in the folder a command runs from hides the
    package inside it from an editable install in setuptools' default mode (its finder is asked after the path), and
    the first use fails far away (``cannot import name 'OrtGradientOptimizer' from 'ortflow' (unknown location)``)."""
    import importlib.util

    spec = importlib.util.find_spec("ortflow")
    if spec is not None and spec.origin is None and spec.submodule_search_locations is not None:
        folders = list(spec.submodule_search_locations)
        raise ImportError(f"'ortflow' resolves to the folder {folders[0] if len(folders) == 1 else folders}, which "
                          "holds no ortflow package (no __init__.py): a folder named ortflow (a clone of the "
                          "repository?) in the folder this runs from hides the installed package; run from another "
                          "folder, or install the clone with `pip install -e <clone> --config-settings "
                          "editable_mode=compat` (what `make` does)", name="ortflow")


_check_ortflow_is_the_package()
