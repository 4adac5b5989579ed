"""``python -m pipelines.main key=value ...``: the chain, the same as ``python -m pipelines main`` (see
pipelines/__main__.py and pipelines/orchestration/chain.py); examples in ``--help`` and docs/PIPELINES.md."""
from .cli import app

main = app("main")
if __name__ == "__main__":
    main()
