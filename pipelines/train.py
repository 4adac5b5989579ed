"""``python -m pipelines.train key=value ...``: the same as ``python -m pipelines train`` (pipelines/__main__.py)."""
from .cli import app

main = app("train")
if __name__ == "__main__":
    main()
