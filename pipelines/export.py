"""``python -m pipelines.export key=value ...``: the same as ``python -m pipelines export`` (pipelines/__main__.py)."""
from .cli import app

main = app("export")
if __name__ == "__main__":
    main()
