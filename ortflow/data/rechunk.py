"""A stream's chunks re-cut into whole batches: :func:`whole_batches` turns the chunks of a
:class:`ortflow.data.sources.BatchSource` (any number of rows each) into training units of whole batches, the rows left
over at a chunk's end joined to the next chunk's first rows, and skips the rows a resumed epoch already trained."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from .graph_spec import TrainData


def whole_batches(source, order_rng, batch_size: int, prepare: Callable[..., TrainData], skip: int = 0,
                  count: Callable[[int], None] | None = None) -> Iterator[tuple[TrainData, np.ndarray | None]]:
    """The epoch's units ``(data, order)`` of whole batches of ``batch_size`` rows (the last one may be short) from
    ``source.chunks(order_rng)``, each chunk made a :class:`TrainData` by ``prepare(X, y, weight)``, from row
    ``skip`` on: the rows before it are skipped by the source when it can, else read (the order and random state
    depend on them) but neither converted nor trained. A chunk the source yields with its rows' order stays as read,
    the trainer gathering each batch; the rows left over at a chunk's end (fewer than a batch) are copied out and
    joined to the next chunk's first rows. ``count(n)`` is told every row handed on (and the ``skip`` rows)."""
    count = count or (lambda n: None)
    skipped = bool(skip) and getattr(source, "skips_rows", False)  # the source skips them itself
    carry, read, bs = None, skip if skipped else 0, batch_size
    count(skip)
    for item in (source.chunks(order_rng, skip_rows=skip) if skipped else source.chunks(order_rng)):
        X, y_part, w_part, order = item if len(item) == 4 else (*item, None)
        n = len(y_part) if order is None else len(order)
        read += n
        if read <= skip:
            continue
        data = prepare(X, y_part, w_part)
        start = max(0, skip - (read - n))  # the rows of this chunk trained before a resume
        if carry is not None:
            end = min(n, start + bs - carry.n_samples)
            carry, start = concatenated(carry, rows_of(data, order, start, end)), end
            if carry.n_samples < bs:
                continue
            count(bs)
            yield carry, None
            carry = None
        whole = start + (n - start) // bs * bs
        if whole > start:
            count(whole - start)
            yield (data.take(slice(start, whole)), None) if order is None else (data, order[start:whole])
        if whole < n:
            carry = rows_of(data, order, whole, n)
    if carry is not None:
        count(carry.n_samples)
        yield carry, None


def rows_of(data: TrainData, order, start: int, stop: int) -> TrainData:
    """Rows ``start:stop`` of a chunk in its training order (``order``, or as stored when None), copied out."""
    return data.take(slice(start, stop) if order is None else order[start:stop])


def concatenated(a: TrainData, b: TrainData) -> TrainData:
    """The rows of ``a`` then ``b`` (a stream's leftover rows joined to its next chunk)."""
    feeds = {k: np.concatenate([a.feeds[k], b.feeds[k]]) for k in a.feeds}
    weight = None if a.weight is None else np.concatenate([a.weight, b.weight])
    return TrainData(feeds, np.concatenate([a.y, b.y]), weight)
