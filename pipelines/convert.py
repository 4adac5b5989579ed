"""``python -m pipelines.convert key=value ...``: the same as ``python -m pipelines convert`` (pipelines/__main__.py)."""
from .cli import app

main = app("convert")
if __name__ == "__main__":
    main()
