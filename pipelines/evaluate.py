"""``python -m pipelines.evaluate key=value ...``: the same as ``python -m pipelines evaluate`` (pipelines/__main__.py)."""
from .cli import app

main = app("evaluate")
if __name__ == "__main__":
    main()
