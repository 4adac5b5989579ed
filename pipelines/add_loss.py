"""``python -m pipelines.add_loss key=value ...``: the same as ``python -m pipelines add_loss`` (pipelines/__main__.py)."""
from .cli import app

main = app("add_loss")
if __name__ == "__main__":
    main()
